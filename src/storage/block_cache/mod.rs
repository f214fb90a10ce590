//! A remote object as storage: bytes come from ranged GETs (an [`ObjectSource`]) into a local
//! block cache, and every read is served from the cache file, so once a block is there the
//! object behaves as a local pack (page cache, `mincore`, `mlock`, the same read-ahead).
//!
//! The cache of one object (one URL at one ETag) is a directory ([`dir`]) holding `data`, a
//! sparse file the object's size where each fetched block sits at its own offset, and
//! `blocks`, the block table ([`table`]). A block is written before its entry; after a crash
//! an entry is trusted only once the block's bytes match its CRC (a clean close leaves a
//! marker that lets the next mount trust the table). Blocks are evicted by CLOCK
//! ([`blocks`]) within the cache size, their space returned with `fallocate(PUNCH_HOLE)`.
//! Eviction bumps [`Storage::generation`], which makes the read path check samples' CRCs
//! again.
//!
//! Fetching: the blocks a read lacks are claimed (single flight: a block being fetched or
//! checked is waited for, never fetched or counted twice), runs of adjacent missing blocks
//! become one GET of at most [`MERGE`] bytes, and the GETs of one read run concurrently within
//! the source's limit. [`Storage::will_need`] starts the same fetches without waiting. When
//! the cache's file system is full, the cache shrinks to what it holds and a fetched block
//! that still cannot be stored is served from memory.

mod ahead;
mod blocks;
mod budget;
pub(crate) use budget::open_lock;
mod dir;
mod exact;
mod fill;
mod table;
#[cfg(test)]
mod tests;

pub use blocks::{BLOCK, MERGE, State};
pub use budget::{cache_budget, live_shares, prune, record_share};
pub use dir::{CacheDir, cache_dir, check_root, default_root, url_prefix};
pub use exact::{GAP, HELD_MAX};

use super::Storage;
use super::local::{LocalObject, LocalStorage};
use super::object::source::ObjectSource;
use crate::storage::ObjectId;
use blocks::Blocks;
use exact::Exact;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use table::Table;

/// Smallest cache size used, bytes (a smaller `--cache-size` is raised to it): two merged
/// GETs. A cache smaller than the read-ahead window (`--prefetch-max-mb`, 64 MiB) evicts blocks
/// fetched ahead before they are read, which is correct but fetches them twice.
pub const MIN_CACHE: u64 = 2 * MERGE;

/// Name of the marker a clean close leaves in the cache directory.
const CLEAN: &str = "clean";

/// The block cache of one remote object, and the object's source.
pub struct BlockCache {
    c: Arc<BlockCacheShared>,
}

struct BlockCacheShared {
    source: Arc<dyn ObjectSource>,
    len: u64,
    data: File,
    table: Table,
    /// The cache file as a local object (page cache verbs, pin).
    local: LocalStorage,
    blocks: Blocks,
    generation: AtomicU64,
    /// Held while damaged samples' blocks are fetched again.
    refetching: Mutex<()>,
    /// Set by a close: no block is stored after it.
    closed: RwLock<bool>,
    /// Failed read-ahead fetches are logged at most once per interval.
    fetch_log: crate::stats::LogLimit,
    /// Set once a full file system was logged.
    full_logged: std::sync::atomic::AtomicBool,
    /// Threads writing into the directory, joined at close.
    writers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Waiters for blocks being fetched or checked.
    wait: (Mutex<()>, Condvar),
    /// Blocks fetched and stored.
    fetched: AtomicU64,
    /// Blocks evicted.
    evicted: AtomicU64,
    /// Cached blocks found damaged (CRC mismatch) and fetched again: each counted once.
    damaged: AtomicU64,
    /// Exact ranges of a sparse announced order, held in memory.
    exact: Exact,
    dir: CacheDir,
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("source", &self.c.source)
            .field("len", &self.c.len)
            .field("limit", &self.c.limit())
            .finish()
    }
}

/// Whether the cache in `dir` of an object of `len` bytes was closed cleanly and holds every
/// block overlapping `r` (their table entries well formed, of the right length), read from
/// its files without changing them. Errors: the table cannot be read.
pub fn complete_on_disk(dir: &CacheDir, len: u64, r: &std::ops::Range<u64>) -> io::Result<bool> {
    if !dir.has(CLEAN) {
        return Ok(false);
    }
    if r.is_empty() {
        return Ok(true);
    }
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut dir.open_ro("blocks")?, &mut raw)?;
    let (first, last) = (r.start / BLOCK, (r.end.min(len) - 1) / BLOCK);
    Ok((first..=last).all(|b| {
        let want = (len - b * BLOCK).min(BLOCK);
        let at = (b * table::ENTRY) as usize;
        raw.get(at..at + table::ENTRY as usize)
            .and_then(table::parse_entry)
            .is_some_and(|(_, l)| u64::from(l) == want)
    }))
}

impl BlockCache {
    /// The block cache of the opened (pinned) object `source` in the locked directory `dir`
    /// (blocks of an earlier mount are kept), holding at most `limit` bytes of blocks (at least
    /// [`MIN_CACHE`]).
    ///
    /// Errors: the source is not pinned, or the directory's files cannot be opened (a link
    /// planted in their place included) or written.
    pub fn open(
        source: Arc<dyn ObjectSource>,
        dir: CacheDir,
        limit: u64,
    ) -> io::Result<BlockCache> {
        let pin = source
            .pin()
            .cloned()
            .ok_or_else(|| io::Error::other("remote object not opened"))?;
        let len = pin.size;
        let data = dir.open_rw("data")?;
        // A data file of another length was cut short or grown behind this cache's back (a
        // full disk, a tamperer): its blocks cannot be trusted even after a clean close.
        let resized = data.metadata()?.len() != len;
        if resized {
            data.set_len(len)?;
        }
        let blocks = Blocks::new(len, limit.max(MIN_CACHE) / BLOCK);
        let (table, entries) = Table::load(dir.open_rw("blocks")?, blocks.count())?;
        // After a clean close every entry's block is on disk: trusted as is. Otherwise (a
        // crash, a kill) each is checked before first use. The marker goes before serving, so
        // a crash of this mount leaves none.
        let clean = dir.has(CLEAN);
        if clean {
            dir.remove(CLEAN)?;
            dir.sync()?;
        }
        let trusted = clean && !resized;
        let kept = if trusted {
            State::Present
        } else {
            State::Unchecked
        };
        for (b, e) in entries.into_iter().enumerate() {
            if let Some((c, l)) = e
                && u64::from(l) == blocks.bytes(b).end - blocks.bytes(b).start
            {
                blocks.slot(b).set(kept);
                blocks.slot(b).crc.store(c, Relaxed);
                blocks.used.fetch_add(1, Relaxed);
            }
        }
        let meta = serde_json::json!({
            "url": source.url(), "etag": pin.etag, "version": pin.version,
            "size": len, "block": BLOCK,
        });
        if let Ok(f) = dir.open_rw("object.json") {
            let _ = f
                .set_len(0)
                .and_then(|()| f.write_all_at(meta.to_string().as_bytes(), 0));
        }
        // SAFETY: a read-only shared map of the cache file, which only this process writes
        // (the directory is locked); bytes of a block are read only once it is complete.
        let map = unsafe { memmap2::Mmap::map(&data)? };
        let local = LocalStorage::new(vec![LocalObject::new(data.try_clone()?, Arc::new(map))]);
        let c = BlockCacheShared {
            source,
            len,
            data,
            table,
            local,
            blocks,
            generation: AtomicU64::new(0),
            refetching: Mutex::new(()),
            closed: RwLock::new(false),
            fetch_log: crate::stats::LogLimit::default(),
            full_logged: Default::default(),
            writers: Mutex::new(Vec::new()),
            wait: (Mutex::new(()), Condvar::new()),
            fetched: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            damaged: AtomicU64::new(0),
            exact: Exact::new(HELD_MAX),
            dir,
        };
        // A smaller cache size than last time: evict down to it now.
        while c.blocks.used.load(Relaxed) > c.blocks.limit.load(Relaxed) {
            if !c.evict_one() {
                break;
            }
        }
        Ok(BlockCache { c: Arc::new(c) })
    }

    /// Downloads the whole object into the cache and waits for it: every block not cached is
    /// fetched, and every block is checked and stored in the data file ([`Self::data_path`]),
    /// which then holds the object's bytes (what indexing a remote dataset scans). Errors: a
    /// GET failed, or a block could not be stored (a full disk).
    pub fn download(&self) -> io::Result<()> {
        self.download_range(0..self.c.len)
    }

    /// Downloads the blocks covering `r` (bytes of the object, clamped to its end) and waits
    /// until they are stored in the data file, as [`Self::download`] does for the whole
    /// object: what indexing a dataset from its tables alone reads (a zip's central directory,
    /// an FFCV file's metadata and allocation tables). Errors: as [`Self::download`].
    pub fn download_range(&self, r: std::ops::Range<u64>) -> io::Result<()> {
        self.download_ranges(&[r])
    }

    /// [`Self::download_range`] of several ranges, their GETs concurrent (one round trip for
    /// a file's head and tail).
    pub fn download_ranges(&self, ranges: &[std::ops::Range<u64>]) -> io::Result<()> {
        let len = self.c.len;
        let ranges: Vec<std::ops::Range<u64>> = (ranges.iter())
            .map(|r| r.start.min(len)..r.end.min(len))
            .filter(|r| !r.is_empty())
            .collect();
        self.c.fetch_all_of(&ranges)?;
        for r in &ranges {
            let held = self.c.hold(r)?;
            let unstored = !held.memory.is_empty();
            self.c.blocks.unhold(held.blocks);
            if unstored {
                return Err(io::Error::other(format!(
                    "{}: the cache's file system is full",
                    self.c.dir.path().display()
                )));
            }
        }
        Ok(())
    }

    /// Sets the most bytes of exact ranges this object holds in memory (default
    /// [`HELD_MAX`]): the objects of one dataset share that bound between them.
    pub fn set_exact_max(&self, bytes: u64) {
        self.c.exact.set_cap(bytes);
    }

    /// The cache's data file: the object's bytes at their offsets (blocks not cached are
    /// holes).
    pub fn data_path(&self) -> std::path::PathBuf {
        self.c.dir.path().join("data")
    }

    /// The object's source.
    pub fn source(&self) -> &Arc<dyn ObjectSource> {
        &self.c.source
    }

    /// Bytes of blocks cached now.
    pub fn cached_bytes(&self) -> u64 {
        self.c.blocks.used.load(Relaxed) * BLOCK
    }

    /// The cache size limit, bytes.
    pub fn limit(&self) -> u64 {
        self.c.limit()
    }

    /// Keeps `w` (a thread writing into the cache directory) to be joined before the cache
    /// closes.
    pub fn join_on_close(&self, w: std::thread::JoinHandle<()>) {
        if let Ok(mut v) = self.c.writers.lock() {
            v.push(w);
        }
    }

    /// Waits for the threads given to [`BlockCache::join_on_close`].
    pub fn join_writers(&self) {
        let ws = self.c.writers.lock().map(|mut v| std::mem::take(&mut *v));
        for w in ws.unwrap_or_default() {
            let _ = w.join();
        }
    }

    /// Blocks fetched and stored, evicted, and found damaged (CRC-32C mismatch) since opened.
    pub fn counters(&self) -> (u64, u64, u64) {
        (
            self.c.fetched.load(Relaxed),
            self.c.evicted.load(Relaxed),
            self.c.damaged.load(Relaxed),
        )
    }

    /// The state of block `b` (for tests and reports).
    pub fn state(&self, b: usize) -> State {
        self.c.blocks.slot(b).state()
    }
}

impl BlockCacheShared {
    fn limit(&self) -> u64 {
        self.blocks.limit.load(Relaxed) * BLOCK
    }

    /// Evicts blocks until one more fits (CLOCK). A cache whose every block is pinned or
    /// being read grows past its limit by the blocks in flight.
    /// Takes a place for one more block within the limit, evicting by CLOCK to make one: the
    /// check and the count are one atomic step, so concurrent stores never overshoot. When no
    /// block can be evicted (every one pinned or being read) the block is counted all the
    /// same (the caller stores it), the only way past the limit.
    fn make_room(&self) {
        loop {
            let used = self.blocks.used.load(Relaxed);
            if used < self.blocks.limit.load(Relaxed) {
                if (self.blocks.used)
                    .compare_exchange(used, used + 1, Relaxed, Relaxed)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            if !self.evict_one() {
                self.blocks.used.fetch_add(1, Relaxed);
                return;
            }
        }
    }

    /// Evicts one block chosen by CLOCK; false if none can be.
    fn evict_one(&self) -> bool {
        match self.blocks.take_victim() {
            Some((b, _)) => {
                self.drop_taken(b);
                true
            }
            None => false,
        }
    }

    /// Drops block `b` (already moved to Evicting) from the cache.
    fn drop_taken(&self, b: usize) {
        self.generation.fetch_add(1, SeqCst);
        let _ = self.table.clear(b);
        let r = self.blocks.bytes(b);
        let _ = nix::fcntl::fallocate(
            &self.data,
            nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            r.start as i64,
            (r.end - r.start) as i64,
        );
        self.blocks.used.fetch_sub(1, Relaxed);
        self.evicted.fetch_add(1, Relaxed);
        self.blocks.slot(b).set(State::Missing);
        self.notify();
    }

    /// Stops storing blocks, makes every stored block and entry durable, then leaves the
    /// clean marker (itself made durable) that lets the next mount trust the table.
    fn close(&self) -> io::Result<()> {
        let mut closed = self
            .closed
            .write()
            .map_err(|_| io::Error::other("poisoned"))?;
        if *closed {
            return Ok(());
        }
        *closed = true;
        self.data.sync_data()?;
        self.table.sync()?;
        self.dir.open_rw(CLEAN)?.sync_all()?;
        self.dir.sync()
    }
}

impl Storage for BlockCache {
    fn len(&self, obj: ObjectId) -> u64 {
        if obj == 0 { self.c.len } else { 0 }
    }

    fn read_at(&self, obj: ObjectId, off: u64, buf: &mut [u8]) -> io::Result<()> {
        if obj != 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such object"));
        }
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.c.len)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{} bytes at {off} run past the end of the object ({})",
                        buf.len(),
                        self.c.len
                    ),
                )
            })?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.c.exact.read(off, buf) {
            return self.c.source.check_served(&(off..end));
        }
        let held = self.c.hold(&(off..end))?;
        let res = self.c.data.read_exact_at(buf, off);
        // Blocks that could not be stored (a full disk) are served from the fetched bytes.
        for (r, bytes) in &held.memory {
            let s = r.start.max(off);
            let e = r.end.min(end);
            if s < e {
                buf[(s - off) as usize..(e - off) as usize]
                    .copy_from_slice(&bytes[(s - r.start) as usize..(e - r.start) as usize]);
            }
        }
        self.c.blocks.unhold(held.blocks);
        res?;
        self.c.source.check_served(&(off..end))
    }

    fn will_need(&self, obj: ObjectId, r: &Range<u64>) {
        if obj == 0 {
            BlockCacheShared::will_need(&self.c, r);
        }
    }

    /// Fetches the ranges not cached as blocks alone, into memory (module `exact`).
    fn will_need_exact(&self, obj: ObjectId, ranges: &[Range<u64>]) {
        if obj == 0 {
            BlockCacheShared::will_need_exact(&self.c, ranges);
        }
    }

    fn resident_bytes(&self, obj: ObjectId, r: &Range<u64>) -> u64 {
        if obj != 0 {
            return 0;
        }
        self.c.local.resident_bytes(0, r)
    }

    fn resident(&self, obj: ObjectId, r: &Range<u64>) -> bool {
        obj == 0
            && self
                .c
                .blocks
                .covering(r)
                .all(|b| self.c.blocks.slot(b).state().cached())
            && self.c.local.resident(0, r)
    }

    fn release(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        self.c.local.release(obj, r)
    }

    /// Evicts the cache file's pages of `r` (the next read comes from the cache's disk, as a
    /// local pack's comes from its disk); the blocks stay cached. `drop-cache` makes reads
    /// cold, not the download to be paid again: dropping blocks here made a soak with a
    /// drop-cache every 5 s receive 60× the pack.
    fn evict(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        self.c.local.evict(obj, r)
    }

    fn pin(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        let blocks = self.c.blocks.covering(r);
        if blocks.len() as u64 > self.c.blocks.limit.load(Relaxed) {
            return Err(io::Error::other(format!(
                "cannot pin {} bytes: the block cache holds at most {} (--cache-size)",
                r.end - r.start,
                self.c.limit()
            )));
        }
        for b in blocks.clone() {
            self.c.blocks.slot(b).pinned.store(true, Relaxed);
        }
        self.c.fetch_all(r)?;
        let held = self.c.hold(r)?;
        let unstored = !held.memory.is_empty();
        self.c.blocks.unhold(held.blocks);
        if unstored {
            return Err(io::Error::other(
                "cannot pin: the cache's file system is full",
            ));
        }
        self.c.local.pin(obj, r)
    }

    fn generation(&self) -> u64 {
        self.c.generation.load(SeqCst)
    }

    fn refetch(&self, obj: ObjectId, r: &Range<u64>, seen: u64) -> bool {
        if obj != 0 || r.is_empty() {
            return false;
        }
        self.c.exact.forget(r);
        match self.c.refetch(r, seen) {
            Ok(()) => true,
            Err(e) => {
                log::error!("fetching bytes {}..{} again failed: {e}", r.start, r.end);
                false
            }
        }
    }

    fn close(&self) {
        self.join_writers();
        if let Err(e) = self.c.close() {
            log::warn!(
                "block cache {}: cannot close cleanly ({e}); its blocks will be checked at the next mount",
                self.c.dir.path().display()
            );
        }
    }

    fn remote_report(&self) -> Option<crate::report::RemoteReport> {
        let c = &self.c;
        let st = c.source.stats();
        Some(crate::report::RemoteReport {
            url: c.source.url().to_string(),
            etag: c.source.pin().map(|p| p.etag.clone()).unwrap_or_default(),
            gets: st.gets.load(Relaxed),
            bytes_received: st.bytes.load(Relaxed),
            failed_gets: st.failed.load(Relaxed),
            blocks_fetched: c.fetched.load(Relaxed),
            blocks_evicted: c.evicted.load(Relaxed),
            blocks_damaged: c.damaged.load(Relaxed),
            cached_bytes: c.blocks.used.load(Relaxed) * BLOCK,
            cache_limit_bytes: c.limit(),
            cache_dir: c.dir.path().display().to_string(),
            offline: c.source.offline(),
            exact_gets: c.exact.gets.load(Relaxed),
            exact_bytes_received: c.exact.bytes.load(Relaxed),
            exact_bytes_served: c.exact.served.load(Relaxed),
            exact_held_bytes: c.exact.held(),
        })
    }

    fn warm_ahead(&self) -> u64 {
        // Enough merged GETs to fill every request slot.
        MERGE * self.c.source.max_requests() as u64
    }

    fn warm_budget(&self) -> Option<u64> {
        Some(self.c.limit())
    }
}
