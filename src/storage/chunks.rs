//! Compressed chunks as storage objects: an object whose bytes are the decompressed content of a
//! compressed range of a local file (a zstd MDS shard or LitData chunk, a deflated zip member).
//! A chunk is decompressed whole, once, into a bounded LRU cache of decompressed chunks
//! (`--chunk-cache`), single flight (concurrent readers of a chunk being decompressed wait for
//! it), and checked: a zip member against its CRC-32, every chunk against its decompressed
//! length. Reading a chunk decompresses the next two on background threads, so an in-order walk
//! finds them ready (read-ahead in chunk order); `will_need` decompresses ahead the same way.
//!
//! [`MixedStorage`] serves a dataset whose files are partly plain (through [`LocalStorage`]) and
//! partly compressed chunks.

use super::Storage;
use super::local::{LocalObject, LocalStorage};
use crate::catalog::ObjectId;
use nix::fcntl::PosixFadviseAdvice;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};

/// The largest decompressed chunk served, bytes (1 GiB): a chunk is decompressed whole into
/// memory, so a longer claim (a decompression bomb, a damaged length) is refused, naming the
/// file. Real chunks are far smaller: MDS shards and LitData chunks default to 64 MiB
/// (`size_limit`, `chunk_bytes`), and a zip member of a sample dataset is one file.
pub const MAX_CHUNK: u64 = 1 << 30;

/// How a chunk is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// A zstd stream (one or more frames).
    Zstd,
    /// Raw deflate (a zip member).
    Deflate,
    /// The image values of one row group of a Parquet file, concatenated in row order, as the
    /// `parquet` crate decodes them (any codec, dictionary or not). `range` is unused.
    ParquetRowGroup,
}

/// One compressed chunk: bytes `range` of `path`, `len` bytes once decompressed.
#[derive(Debug)]
pub struct Chunk {
    /// The file, for messages.
    pub path: PathBuf,
    /// The file, shared by every chunk of it (a zip of many members opens it once).
    pub file: Arc<File>,
    /// The compressed bytes in the file.
    pub range: Range<u64>,
    /// How they are compressed.
    pub codec: Codec,
    /// Decompressed length, bytes.
    pub len: u64,
    /// CRC-32 of the decompressed bytes, when the container records one (zip).
    pub crc32: Option<u32>,
    /// For [`Codec::ParquetRowGroup`]: the row group and the image column's group name.
    pub parquet: Option<(usize, String)>,
}

impl Chunk {
    /// The concatenated image bytes of a Parquet row group (see [`Codec::ParquetRowGroup`]).
    fn parquet_images(&self) -> io::Result<Vec<u8>> {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::record::Field;
        let bad = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", self.path.display()),
            )
        };
        // Its own open file: the crate seeks and reads, and a dup of the shared handle would
        // share the offset with other row groups decoded at the same time.
        let (g, image) = self
            .parquet
            .clone()
            .ok_or_else(|| bad("no row group given".into()))?;
        let reader =
            SerializedFileReader::new(File::open(&self.path)?).map_err(|e| bad(e.to_string()))?;
        let rg = reader
            .get_row_group(g)
            .map_err(|e| bad(format!("row group {g}: {e}")))?;
        let mut out = Vec::with_capacity(self.len as usize);
        for row in rg
            .get_row_iter(None)
            .map_err(|e| bad(format!("row group {g}: {e}")))?
        {
            let row = row.map_err(|e| bad(format!("row group {g}: {e}")))?;
            for (name, field) in row.get_column_iter() {
                if let (true, Field::Group(img)) = (*name == image, field) {
                    for (n, v) in img.get_column_iter() {
                        if let ("bytes", Field::Bytes(b)) = (n.as_str(), v) {
                            out.extend_from_slice(b.data());
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Reads and decompresses the chunk. Errors: I/O, a damaged stream, a length or CRC-32
    /// that does not match (the message names the file).
    pub fn decompress(&self) -> io::Result<Vec<u8>> {
        let bad = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", self.path.display()),
            )
        };
        if self.len > MAX_CHUNK {
            return Err(bad(format!(
                "a chunk of {} bytes decompressed is over the {} byte limit for one chunk",
                self.len, MAX_CHUNK
            )));
        }
        if self.codec == Codec::ParquetRowGroup {
            let out = self.parquet_images()?;
            if out.len() as u64 != self.len {
                return Err(bad(format!(
                    "row group images are {} bytes, the index says {}",
                    out.len(),
                    self.len
                )));
            }
            return Ok(out);
        }
        let mut raw = vec![0u8; (self.range.end - self.range.start) as usize];
        self.file.read_exact_at(&mut raw, self.range.start)?;
        // The length is the file's own claim: grown as the stream proves it, not reserved.
        let mut out = Vec::with_capacity(self.len.min(16 << 20) as usize);
        let r = match self.codec {
            Codec::ParquetRowGroup => unreachable!("handled above"),
            Codec::Zstd => zstd::stream::read::Decoder::new(&raw[..])?
                .take(self.len + 1)
                .read_to_end(&mut out),
            Codec::Deflate => flate2::read::DeflateDecoder::new(&raw[..])
                .take(self.len + 1)
                .read_to_end(&mut out),
        };
        r.map_err(|e| {
            bad(format!(
                "bytes {}..{} do not decompress ({e})",
                self.range.start, self.range.end
            ))
        })?;
        if out.len() as u64 != self.len {
            return Err(bad(format!(
                "bytes {}..{} decompress to {} bytes, the index says {}",
                self.range.start,
                self.range.end,
                out.len(),
                self.len
            )));
        }
        if let Some(want) = self.crc32 {
            let got = crc32fast::hash(&out);
            if got != want {
                return Err(bad(format!(
                    "decompressed CRC-32 {got:08x}, the archive says {want:08x}"
                )));
            }
        }
        Ok(out)
    }
}

/// A plain local file or a compressed chunk.
#[derive(Debug)]
pub enum Part {
    /// A file read through the page cache.
    Plain(LocalObject),
    /// A compressed chunk, decompressed into the chunk cache.
    Chunk(Chunk),
}

struct Cache {
    /// Decompressed chunks by object (O(1) per read: a zip of 30k members is 30k chunks).
    lru: lru::LruCache<ObjectId, Arc<Vec<u8>>>,
    bytes: u64,
    /// Chunks being decompressed now (single flight).
    busy: HashMap<ObjectId, Arc<(Mutex<bool>, Condvar)>>,
    /// Pinned chunks: kept outside the LRU budget.
    pinned: HashMap<ObjectId, Arc<Vec<u8>>>,
}

/// Storage over plain files and compressed chunks (object ids as the catalog numbers them).
pub struct MixedStorage {
    plain: LocalStorage,
    /// Per object: `Ok(k)` = plain object k of `plain`; `Err(k)` = chunk k of `chunks`.
    map: Vec<Result<u32, usize>>,
    chunks: Vec<Chunk>,
    cache: Mutex<Cache>,
    budget: u64,
    background: AtomicUsize,
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
        let mut chunks = Vec::new();
        let mut map = Vec::new();
        for p in parts {
            match p {
                Part::Plain(o) => {
                    map.push(Ok(plain.len() as u32));
                    plain.push(o);
                }
                Part::Chunk(c) => {
                    map.push(Err(chunks.len()));
                    chunks.push(c);
                }
            }
        }
        Arc::new_cyclic(|me| MixedStorage {
            plain: LocalStorage::new(plain),
            map,
            chunks,
            cache: Mutex::new(Cache {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
                busy: HashMap::new(),
                pinned: HashMap::new(),
            }),
            budget,
            background: AtomicUsize::new(0),
            me: me.clone(),
        })
    }

    fn part(&self, obj: ObjectId) -> io::Result<Result<u32, usize>> {
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
                        let f = Arc::new((Mutex::new(false), Condvar::new()));
                        c.busy.insert(obj, f.clone());
                        (f, true)
                    }
                }
            };
            if !leader {
                let (m, cv) = &*flight;
                let mut done = m
                    .lock()
                    .map_err(|_| io::Error::other("chunk cache poisoned"))?;
                while !*done {
                    done = cv
                        .wait(done)
                        .map_err(|_| io::Error::other("chunk cache poisoned"))?;
                }
                // Decompressed (or failed): look again; a failure is retried by this reader.
                if let Some(d) = self.cached(obj) {
                    return Ok(d);
                }
                continue;
            }
            // A decoder that panics on damaged bytes (the Parquet crate does) fails this chunk
            // like any damaged stream: the single flight below is cleared either way.
            let ch = &self.chunks[k];
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
            if let Ok(d) = &r {
                c.bytes += d.len() as u64;
                c.lru.put(obj, d.clone());
                while c.bytes > self.budget && c.lru.len() > 1 {
                    if let Some((_, old)) = c.lru.pop_lru() {
                        c.bytes -= old.len() as u64;
                    }
                }
            }
            c.busy.remove(&obj);
            drop(c);
            let (m, cv) = &*flight;
            if let Ok(mut done) = m.lock() {
                *done = true;
            }
            cv.notify_all();
            return r;
        }
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
        let _ = super::fadvise(
            &first.file,
            &(first.range.start..end.max(first.range.start)),
            PosixFadviseAdvice::POSIX_FADV_WILLNEED,
        );
    }

    /// Decompresses object `obj` on a background thread if it is a chunk not yet cached
    /// (at most [`BACKGROUND`] at a time; further requests are dropped).
    fn ahead(&self, obj: ObjectId) {
        let Ok(Err(k)) = self.part(obj) else { return };
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
            Ok(Ok(k)) => self.plain.len(k),
            Ok(Err(k)) => self.chunks[k].len,
            Err(_) => 0,
        }
    }

    fn read_at(&self, obj: ObjectId, off: u64, buf: &mut [u8]) -> io::Result<()> {
        match self.part(obj)? {
            Ok(k) => self.plain.read_at(k, off, buf),
            Err(k) => {
                let d = self.chunk(obj, k)?;
                let end = off
                    .checked_add(buf.len() as u64)
                    .filter(|&e| e <= d.len() as u64)
                    .ok_or_else(|| {
                        io::Error::new(io::ErrorKind::UnexpectedEof, "read past the chunk")
                    })?;
                buf.copy_from_slice(&d[off as usize..end as usize]);
                // Read-ahead in chunk order: the next two chunks are decompressed in the
                // background while this one is served (two threads: one per core here).
                // Small chunks (a zip member) decompress faster inline than a thread starts.
                if d.len() >= AHEAD_MIN {
                    self.ahead(obj + 1);
                    self.ahead(obj + 2);
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
            Ok(Ok(k)) => self.plain.will_need(k, r),
            Ok(Err(_)) => self.ahead(obj),
            Err(_) => {}
        }
    }

    fn resident_bytes(&self, obj: ObjectId, r: &Range<u64>) -> u64 {
        match self.part(obj) {
            Ok(Ok(k)) => self.plain.resident_bytes(k, r),
            Ok(Err(k)) if self.cached(obj).is_some() => {
                r.end.min(self.chunks[k].len).saturating_sub(r.start)
            }
            _ => 0,
        }
    }

    fn resident(&self, obj: ObjectId, r: &Range<u64>) -> bool {
        match self.part(obj) {
            Ok(Ok(k)) => self.plain.resident(k, r),
            Ok(Err(_)) => self.cached(obj).is_some(),
            Err(_) => false,
        }
    }

    fn release(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        match self.part(obj)? {
            Ok(k) => self.plain.release(k, r),
            // Decompressed chunks serve many samples: the LRU budget bounds them.
            Err(_) => Ok(()),
        }
    }

    fn evict(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        match self.part(obj)? {
            Ok(k) => self.plain.evict(k, r),
            Err(k) => {
                if let Ok(mut c) = self.cache.lock() {
                    if let Some(d) = c.lru.pop(&obj) {
                        c.bytes -= d.len() as u64;
                    }
                }
                // The compressed bytes' pages too, so the next read is cold.
                let ch = &self.chunks[k];
                super::fadvise(&ch.file, &ch.range, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
            }
        }
    }

    fn pin(&self, obj: ObjectId, r: &Range<u64>) -> io::Result<()> {
        match self.part(obj)? {
            Ok(k) => self.plain.pin(k, r),
            Err(k) => {
                let d = self.chunk(obj, k)?;
                if let Ok(mut c) = self.cache.lock() {
                    c.pinned.insert(obj, d);
                }
                Ok(())
            }
        }
    }
}
