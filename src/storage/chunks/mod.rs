//! Compressed chunks as storage objects: an object whose bytes are the decompressed content of a
//! compressed range of a local file (a zstd MDS shard or LitData chunk, a deflated zip member).
//! A chunk is decompressed whole, once, into a bounded LRU cache of decompressed chunks
//! (`--chunk-cache`), single flight (concurrent readers of a chunk being decompressed wait for
//! it), and checked: a zip member against its CRC-32, every chunk against its decompressed
//! length. Reading past the middle of a chunk that a walk reached in order decompresses the next
//! two on background threads, so an in-order walk finds them ready (read-ahead in chunk order;
//! a shuffled walk starts none); `will_need` decompresses ahead the same way.
//!
//! The budget counts chunks being decompressed as well as cached ones: a decompression first
//! evicts least recently used chunks to make room and, while other decompressions hold the
//! room, waits for them; one always proceeds. Decompressed bytes held are so at most
//! `max(--chunk-cache, largest chunk)`, plus chunks evicted while a reader still copies from
//! them (at most one per FUSE thread).
//!
//! [`MixedStorage`] serves a dataset whose files are partly plain (through [`LocalStorage`]) and
//! partly compressed chunks.

mod chunk;
#[cfg(test)]
mod tests;

pub(crate) use chunk::read_declared;
pub use chunk::{Chunk, ChunkFile, Codec, MAX_CHUNK, StoredRead};

use super::Storage;
use super::local::{LocalObject, LocalStorage};
use crate::storage::ObjectId;
use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};

/// A plain object or a compressed chunk: `P` a local file read through the page cache
/// ([`MixedStorage::new`]) or an object of another storage ([`MixedStorage::with_plain`]).
#[derive(Debug)]
pub enum Part<P = LocalObject> {
    /// A plain object, read as it is.
    Plain(P),
    /// A compressed chunk, decompressed into the chunk cache.
    Chunk(Chunk),
}

/// Where the bytes of one of the storage's objects are.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// Object k of the plain storage.
    Plain(ObjectId),
    /// Chunk k of the chunks.
    Chunk(usize),
}

struct Cache {
    /// Decompressed chunks by object (O(1) per read: a zip of 30k members is 30k chunks).
    lru: lru::LruCache<ObjectId, Arc<Vec<u8>>>,
    bytes: u64,
    /// Decompressed bytes of the chunks being decompressed now (their declared lengths).
    inflight: u64,
    /// The most `bytes + inflight` has been.
    peak: u64,
    /// Chunks being decompressed now (single flight).
    busy: HashMap<ObjectId, Arc<Flight>>,
    /// Pinned chunks: kept outside the LRU budget.
    pinned: HashMap<ObjectId, Arc<Vec<u8>>>,
}

/// One decompression in flight: its readers wait on it and take its result from it, not from
/// the cache (which may already have evicted it to make room for another).
#[derive(Default)]
struct Flight {
    /// `None` until the decompression ends; then the chunk, or `None` inside when it failed.
    result: Mutex<Option<Option<Arc<Vec<u8>>>>>,
    done: Condvar,
}

/// Storage over plain files and compressed chunks (object ids as the catalog numbers them).
pub struct MixedStorage {
    plain: Arc<dyn Storage>,
    /// Per object: where its bytes are.
    map: Vec<Slot>,
    chunks: Vec<Chunk>,
    cache: Mutex<Cache>,
    /// Signalled when a decompression ends (room may have been made).
    room: Condvar,
    budget: u64,
    background: AtomicUsize,
    /// The chunk object read last (read-ahead in chunk order follows a walk that stays on a
    /// chunk or moves to the next one, not a shuffled one).
    last: AtomicU32,
    me: std::sync::Weak<MixedStorage>,
}

impl std::fmt::Debug for MixedStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MixedStorage")
            .field("objects", &self.map.len())
            .field("chunks", &self.chunks.len())
            .field("budget", &self.budget)
            .finish()
    }
}

/// Background decompressions at most in flight.
const BACKGROUND: usize = 2;
/// Chunks smaller than this are not decompressed ahead (bytes).
const AHEAD_MIN: usize = 1 << 20;

impl MixedStorage {
    /// Storage over `parts` (object k = part k), keeping at most `budget` bytes of decompressed
    /// chunks (LRU; one chunk is always kept however large).
    pub fn new(parts: Vec<Part>, budget: u64) -> Arc<MixedStorage> {
        let mut plain = Vec::new();
        let parts = parts
            .into_iter()
            .map(|p| match p {
                Part::Plain(o) => {
                    plain.push(o);
                    Part::Plain(plain.len() as u32 - 1)
                }
                Part::Chunk(c) => Part::Chunk(c),
            })
            .collect();
        Self::with_plain(Arc::new(LocalStorage::new(plain)), parts, budget)
    }

    /// Storage over `parts` (object k = part k): `Part::Plain(i)` = object i of `plain` (a
    /// remote dataset's objects through their block caches), `Part::Chunk` = a compressed
    /// chunk (whose bytes may come from `plain` too: [`ChunkFile::Stored`]). The budget as
    /// [`MixedStorage::new`].
    pub fn with_plain(
        plain: Arc<dyn Storage>,
        parts: Vec<Part<ObjectId>>,
        budget: u64,
    ) -> Arc<MixedStorage> {
        let mut chunks = Vec::new();
        let mut map = Vec::new();
        for p in parts {
            match p {
                Part::Plain(k) => map.push(Slot::Plain(k)),
                Part::Chunk(c) => {
                    map.push(Slot::Chunk(chunks.len()));
                    chunks.push(c);
                }
            }
        }
        Arc::new_cyclic(|me| MixedStorage {
            plain,
            map,
            chunks,
            room: Condvar::new(),
            cache: Mutex::new(Cache {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
                inflight: 0,
                peak: 0,
                busy: HashMap::new(),
                pinned: HashMap::new(),
            }),
            budget,
            background: AtomicUsize::new(0),
            last: AtomicU32::new(u32::MAX),
            me: me.clone(),
        })
    }

    fn part(&self, obj: ObjectId) -> io::Result<Slot> {
        self.map.get(obj as usize).copied().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no storage object {obj}"))
        })
    }

    fn cached(&self, obj: ObjectId) -> Option<Arc<Vec<u8>>> {
        let mut c = self.cache.lock().ok()?;
        if let Some(d) = c.pinned.get(&obj) {
            return Some(d.clone());
        }
        c.lru.get(&obj).cloned()
    }

    /// The decompressed chunk `k` (object `obj`), decompressing it if needed (single flight).
    fn chunk(&self, obj: ObjectId, k: usize) -> io::Result<Arc<Vec<u8>>> {
        loop {
            if let Some(d) = self.cached(obj) {
                return Ok(d);
            }
            let (flight, leader) = {
                let mut c = self
                    .cache
                    .lock()
                    .map_err(|_| io::Error::other("chunk cache poisoned"))?;
                match c.busy.get(&obj) {
                    Some(f) => (f.clone(), false),
                    None => {
                        let f = Arc::new(Flight::default());
                        c.busy.insert(obj, f.clone());
                        (f, true)
                    }
                }
            };
            if !leader {
                let mut r = flight
                    .result
                    .lock()
                    .map_err(|_| io::Error::other("chunk cache poisoned"))?;
                while r.is_none() {
                    r = flight
                        .done
                        .wait(r)
                        .map_err(|_| io::Error::other("chunk cache poisoned"))?;
                }
                // Decompressed: the leader's bytes. Failed: this reader tries again.
                if let Some(Some(d)) = r.as_ref() {
                    return Ok(d.clone());
                }
                continue;
            }
            let ch = &self.chunks[k];
            self.reserve(ch.len);
            // A decoder that panics on damaged bytes (the Parquet crate does) fails this chunk
            // like any damaged stream: the single flight below is cleared either way.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ch.decompress()))
                .unwrap_or_else(|p| {
                    Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: the decoder failed on damaged bytes ({})",
                            ch.path.display(),
                            crate::stats::panic_message(&*p)
                        ),
                    ))
                })
                .map(Arc::new);
            let mut c = self
                .cache
                .lock()
                .map_err(|_| io::Error::other("chunk cache poisoned"))?;
            c.inflight -= ch.len;
            if let Ok(d) = &r {
                c.bytes += d.len() as u64;
                c.lru.put(obj, d.clone());
                while c.bytes > self.budget && c.lru.len() > 1 {
                    if let Some((_, old)) = c.lru.pop_lru() {
                        c.bytes -= old.len() as u64;
                    }
                }
            }
            self.room.notify_all();
            c.busy.remove(&obj);
            drop(c);
            if let Ok(mut done) = flight.result.lock() {
                *done = Some(r.as_ref().ok().cloned());
            }
            flight.done.notify_all();
            return r;
        }
    }

    /// Makes room in the budget for a decompression of `len` bytes: least recently used
    /// chunks are evicted, and while other decompressions hold the room this one waits for
    /// them (one decompression always proceeds, so a chunk larger than the budget is served).
    /// The bytes are counted as in flight until the caller takes them off.
    fn reserve(&self, len: u64) {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            while c.bytes + c.inflight + len > self.budget {
                match c.lru.pop_lru() {
                    Some((_, old)) => c.bytes -= old.len() as u64,
                    None => break,
                }
            }
            if c.inflight == 0 || c.bytes + c.inflight + len <= self.budget {
                break;
            }
            c = self.room.wait(c).unwrap_or_else(|e| e.into_inner());
        }
        c.inflight += len;
        c.peak = c.peak.max(c.bytes + c.inflight);
    }

    /// The most decompressed bytes the cache has held at once, cached and being decompressed
    /// (pinned chunks aside): at most `max(budget, largest chunk)`.
    pub fn peak_bytes(&self) -> u64 {
        self.cache.lock().map_or(0, |c| c.peak)
    }

    /// Asks the device for the compressed bytes of chunks `from..to` that lie in the same file
    /// as chunk `from` (one `POSIX_FADV_WILLNEED` over their span).
    fn will_need_stored(&self, from: usize, to: usize) {
        let Some(first) = self.chunks.get(from) else {
            return;
        };
        let end = self.chunks[from..to.min(self.chunks.len())]
            .iter()
            .take_while(|c| c.path == first.path)
            .map(|c| c.range.end)
            .max()
            .unwrap_or(first.range.end);
        first
            .file
            .will_need(&(first.range.start..end.max(first.range.start)));
    }

    /// Decompresses object `obj` on a background thread if it is a chunk not yet cached
    /// (at most [`BACKGROUND`] at a time; further requests are dropped).
    fn ahead(&self, obj: ObjectId) {
        let Ok(Slot::Chunk(k)) = self.part(obj) else {
            return;
        };
        let wanted = self.cache.lock().is_ok_and(|c| {
            !c.busy.contains_key(&obj) && !c.pinned.contains_key(&obj) && !c.lru.contains(&obj)
        });
        if !wanted {
            return;
        }
        if self.background.fetch_add(1, Relaxed) >= BACKGROUND {
            self.background.fetch_sub(1, Relaxed);
            return;
        }
        let Some(me) = self.me.upgrade() else {
            self.background.fetch_sub(1, Relaxed);
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("loosefs-chunk".into())
            .spawn(move || {
                if let Err(e) = me.chunk(obj, k) {
                    log::error!("{e}");
                }
                me.background.fetch_sub(1, Relaxed);
            });
        if spawned.is_err() {
            self.background.fetch_sub(1, Relaxed);
        }
    }
}

impl Storage for MixedStorage {
    fn len(&self, obj: ObjectId) -> u64 {
        match self.part(obj) {
            Ok(Slot::Plain(k)) => self.plain.len(k),
            Ok(Slot::Chunk(k)) => self.chunks[k].len,
            Err(_) => 0,
        }
    }

    fn read_at(&self, obj: ObjectId, off: u64, buf: &mut [u8]) -> io::Result<()> {
        match self.part(obj)? {
            Slot::Plain(k) => self.plain.read_at(k, off, buf),
            Slot::Chunk(k) => {
                let d = self.chunk(obj, k)?;
                let end = off
                    .checked_add(buf.len() as u64)
                    .filter(|&e| e <= d.len() as u64)
                    .ok_or_else(|| {
                        io::Error::new(io::ErrorKind::UnexpectedEof, "read past the chunk")
                    })?;
                buf.copy_from_slice(&d[off as usize..end as usize]);
                // Read-ahead in chunk order: past the middle of a chunk that a walk reached in
                // order, the next two chunks are decompressed in the background while this one
                // is served (two threads: one per core here). A shuffled walk starts none:
                // they would take the budget from the chunks its readers wait for.
                // Small chunks (a zip member) decompress faster inline than a thread starts.
                let prev = self.last.swap(obj, Relaxed);
                let walking = prev == obj || prev.wrapping_add(1) == obj;
                if d.len() >= AHEAD_MIN {
                    if walking && end > d.len() as u64 / 2 {
                        self.ahead(obj + 1);
                        self.ahead(obj + 2);
                    }
                } else if k % 8 == 0 {
                    // Their compressed bytes are asked from the device instead, 16 chunks on.
                    self.will_need_stored(k + 1, k + 17);
                }
                Ok(())
            }
        }
    }

    fn will_need(&self, obj: ObjectId, r: &Range<u64>) {
        match self.part(obj) {
            Ok(Slot::Plain(k)) => self.plain.will_need(k, r),
            Ok(Slot::Chunk(_)) => self.ahead(obj),
            Err(_) => {}
        }
    }

    fn resident_bytes(&self, obj: ObjectId, r: &Range<u64>) -> u64 {
        match self.part(obj) {
            Ok(Slot::Plain(k)) => self.plain.resident_bytes(k, r),
            Ok(Slot::Chunk(k)) if self.cached(obj).is_some() => {
                r.end.min(self.chunks[k].len).saturating_sub(r.start)
            }
            _ => 0,
        }
    }

    fn resident(&self, obj: ObjectId, r: &Range<u64>) -> bool {
        match self.part(obj) {
            Ok(Slot::Plain(k)) => self.plain.resident(k, r),
            Ok(Slot::Chunk(_)) => self.cached(obj).is_some(),
            Err(_) => false,
        }
    }

    fn release(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        match self.part(obj)? {
            Slot::Plain(k) => self.plain.release(k, r),
            // Decompressed chunks serve many samples: the LRU budget bounds them.
            Slot::Chunk(_) => Ok(()),
        }
    }

    fn evict(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        match self.part(obj)? {
            Slot::Plain(k) => self.plain.evict(k, r),
            Slot::Chunk(k) => {
                if let Ok(mut c) = self.cache.lock() {
                    if let Some(d) = c.lru.pop(&obj) {
                        c.bytes -= d.len() as u64;
                    }
                }
                // The compressed bytes' pages too, so the next read is cold.
                let ch = &self.chunks[k];
                ch.file.evict(&ch.range)
            }
        }
    }

    fn pin(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        match self.part(obj)? {
            Slot::Plain(k) => self.plain.pin(k, r),
            Slot::Chunk(k) => {
                let d = self.chunk(obj, k)?;
                if let Ok(mut c) = self.cache.lock() {
                    c.pinned.insert(obj, d);
                }
                Ok(())
            }
        }
    }

    // The rest as the plain storage answers it (a remote dataset's block caches: their
    // generations, refetches, clean close, counters and warm figures).
    fn will_need_exact(&self, obj: ObjectId, ranges: &[Range<u64>]) {
        match self.part(obj) {
            Ok(Slot::Plain(k)) => self.plain.will_need_exact(k, ranges),
            _ => ranges.iter().for_each(|r| self.will_need(obj, r)),
        }
    }

    fn generation(&self) -> u64 {
        self.plain.generation()
    }

    fn refetch(&self, obj: ObjectId, r: &Range<u64>, seen: u64) -> bool {
        matches!(self.part(obj), Ok(Slot::Plain(k)) if self.plain.refetch(k, r, seen))
    }

    fn close(&self) {
        self.plain.close();
    }

    fn remote_report(&self) -> Option<crate::report::RemoteReport> {
        self.plain.remote_report()
    }

    fn warm_ahead(&self) -> u64 {
        self.plain.warm_ahead()
    }

    fn warm_budget(&self) -> Option<u64> {
        self.plain.warm_budget()
    }
}
