//! On-the-fly decode: serves decoded views (`.npy`, PPM) of JPEG samples.
//!
//! A READ of a view is answered from the decoded cache when the image is there (on the FUSE
//! thread: a copy of the slice asked for). Otherwise the read joins the single flight of that
//! sample ([`cache::DecodedCache::join`]): the first miss reads the JPEG's bytes (on the FUSE
//! thread, which may wait for the disk: decode threads never do) and hands the decode to a pool
//! of `threads` decode threads (turbojpeg, [`codec`]), so a FUSE thread never decodes; every
//! read queued on the sample is answered from the pool when the image is ready.
//! A read at the start of the sample that follows one read just before it in pack order is
//! taken as an in-order reader: the next `ahead` JPEGs in pack order are asked from the disk
//! (`WILLNEED`) and decoded ahead.

pub mod cache;
pub mod codec;
pub mod view;

use crate::namespace::{FsError, Namespace, ViewTarget};
use crate::stats::Histogram;
use cache::{DecodedCache, Join, Waiter};
use codec::Rgb;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Decode settings (`loosefs mount --decode-cache --decode-threads --decode-ahead`).
#[derive(Debug, Clone, Copy)]
pub struct DecodeOptions {
    /// Budget of the decoded cache, bytes of pixels.
    pub cache_bytes: u64,
    /// Decode threads.
    pub threads: usize,
    /// Files decoded ahead of an in-order reader.
    pub ahead: usize,
}

/// The answer to a READ: called once, on whatever thread has the bytes.
pub type Reply = Box<dyn FnOnce(Result<&[u8], FsError>) + Send>;

/// Called after a sample's JPEG bytes were read from the pack (to drop its pack pages).
pub type Release = Box<dyn Fn(&Range<u64>) + Send + Sync>;

/// Counters of the decoder.
#[derive(Debug, Default)]
pub struct DecodeStats {
    /// Images decoded (successes).
    pub decodes: AtomicU64,
    /// Of those, decoded by the fallback decoder.
    pub fallbacks: AtomicU64,
    /// Of those, decoded with a libjpeg warning (corrupt data recovered; pixels kept).
    pub warnings: AtomicU64,
    /// Samples that could not be decoded (answered EIO).
    pub failures: AtomicU64,
    /// READs answered from the decoded cache.
    pub hits: AtomicU64,
    /// READs that started a decode.
    pub misses: AtomicU64,
    /// READs that waited for a decode already under way.
    pub joined: AtomicU64,
    /// Decodes started ahead of an in-order reader.
    pub ahead: AtomicU64,
    /// Time per decode (turbojpeg or the fallback; the JPEG already in memory).
    pub decode_time: Histogram,
}

struct Inner {
    ns: Arc<Namespace>,
    cache: DecodedCache,
    stats: DecodeStats,
    release: Release,
    /// Samples expected next by in-order readers (the file after each recently started one).
    expected: Mutex<VecDeque<u64>>,
    /// One bit per record and view kind (npy, ppm): served since the last [`Decoder::clear`]
    /// (for page-cache invalidation).
    served: [Vec<AtomicU64>; 2],
}

/// The decode service of a mount.
pub struct Decoder {
    inner: Arc<Inner>,
    pool: rayon::ThreadPool,
    opts: DecodeOptions,
}

/// Recently started samples remembered for in-order detection.
const EXPECTED: usize = 32;

thread_local! {
    /// JPEG bytes of the sample being decoded, per decode thread.
    static JPEG_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Bytes of a reply that spans the header, per thread.
    static REPLY_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Decoder {
    /// Starts the decode pool. Errors: the threads cannot be spawned.
    pub fn new(
        ns: Arc<Namespace>,
        opts: DecodeOptions,
        release: Release,
    ) -> std::io::Result<Decoder> {
        let records = ns.pack().totals().records as usize;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads.max(1))
            .thread_name(|i| format!("loosefs-decode-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Decoder {
            inner: Arc::new(Inner {
                ns,
                cache: DecodedCache::new(opts.cache_bytes),
                stats: DecodeStats::default(),
                release,
                expected: Mutex::new(VecDeque::with_capacity(EXPECTED)),
                served: std::array::from_fn(|_| {
                    std::iter::repeat_with(|| AtomicU64::new(0))
                        .take(records.div_ceil(64))
                        .collect()
                }),
            }),
            pool,
            opts,
        })
    }

    /// Answers a READ of `[offset, offset+size)` of view `t` through `reply`, now (cached) or
    /// from a decode thread.
    pub fn read(&self, t: ViewTarget, offset: u64, size: u32, reply: Reply) {
        let inner = &self.inner;
        let (kind, i) = (t.kind as usize, (t.jpeg_ino - 1) as usize);
        if let Some(w) = inner.served[kind].get(i / 64) {
            w.fetch_or(1 << (i % 64), Relaxed);
        }
        if offset == 0 {
            self.note_start(&t);
        }
        let key = (t.jpeg_ino - 1) as u32;
        if let Some(px) = inner.cache.get(key) {
            inner.stats.hits.fetch_add(1, Relaxed);
            serve(&t, &px, offset, size, reply);
            return;
        }
        let waiter: Waiter = Box::new(move |r| match r {
            Ok(px) => serve(&t, &px, offset, size, reply),
            Err(e) => reply(Err(e)),
        });
        match inner.cache.join(key, waiter) {
            Join::Hit(px, waiter) => {
                inner.stats.hits.fetch_add(1, Relaxed);
                waiter(Ok(px));
            }
            Join::Queued => {
                inner.stats.joined.fetch_add(1, Relaxed);
            }
            Join::Lead => {
                inner.stats.misses.fetch_add(1, Relaxed);
                let mut jpeg = Vec::new();
                match inner.read_jpeg(&t, &mut jpeg) {
                    Ok(()) => {
                        let inner = self.inner.clone();
                        self.pool.spawn(move || inner.decode(t, &jpeg));
                    }
                    Err(e) => inner.finish(&t, Err(e)),
                }
            }
        }
    }

    /// Remembers that a reader started `t`; when it was expected (the file after one started
    /// recently), decodes the next files ahead.
    fn note_start(&self, t: &ViewTarget) {
        let inner = &self.inner;
        let next = inner.ns.next_file(t.jpeg_ino);
        let in_order = {
            let mut q = inner.expected.lock().unwrap_or_else(|p| p.into_inner());
            let hit = q.iter().position(|&e| e == t.jpeg_ino);
            if let Some(i) = hit {
                q.remove(i);
            }
            if let Some(n) = next {
                if q.len() == EXPECTED {
                    q.pop_front();
                }
                q.push_back(n);
            }
            hit.is_some()
        };
        if !in_order || self.opts.ahead == 0 {
            return;
        }
        let mut cur = t.jpeg_ino;
        for _ in 0..self.opts.ahead {
            if inner.cache.in_flight() >= 2 * self.opts.threads.max(1) + self.opts.ahead {
                return;
            }
            let Some(n) = inner.ns.next_file(cur) else {
                return;
            };
            cur = n;
            let Some(nt) = inner.ns.view(self.view_ino(t, n)) else {
                continue;
            };
            if inner.cache.start((n - 1) as u32) {
                inner.stats.ahead.fetch_add(1, Relaxed);
                if let Some(r) = inner.ns.data_range(n) {
                    crate::pagecache::will_need(inner.ns.pack().map(), &r);
                }
                let inner = self.inner.clone();
                self.pool.spawn(move || {
                    JPEG_BUF.with_borrow_mut(|buf| {
                        match inner.read_jpeg(&nt, buf) {
                            Ok(()) => inner.decode(nt, buf),
                            Err(e) => inner.finish(&nt, Err(e)),
                        }
                        if buf.capacity() > 4 << 20 {
                            *buf = Vec::new();
                        }
                    });
                });
            }
        }
    }

    /// The inode of the same kind of view as `t` for JPEG inode `jpeg`.
    fn view_ino(&self, t: &ViewTarget, jpeg: u64) -> u64 {
        match t.kind {
            view::ViewKind::Npy => jpeg | crate::namespace::NPY_BIT,
            view::ViewKind::Ppm => jpeg,
        }
    }

    /// Drops every decoded image; returns the view inodes served since the last clear.
    pub fn clear(&self) -> Vec<u64> {
        self.inner.cache.clear();
        self.inner
            .expected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let mut inos = Vec::new();
        for (kind, bits) in self.inner.served.iter().enumerate() {
            for (w, word) in bits.iter().enumerate() {
                let mut b = word.swap(0, Relaxed);
                while b != 0 {
                    let jpeg = (w * 64 + b.trailing_zeros() as usize) as u64 + 1;
                    inos.push(if kind == view::ViewKind::Npy as usize {
                        jpeg | crate::namespace::NPY_BIT
                    } else {
                        jpeg
                    });
                    b &= b - 1;
                }
            }
        }
        inos
    }

    /// The `decode` section of the stats report.
    pub fn stats_json(&self) -> serde_json::Value {
        let s = &self.inner.stats;
        let views = self.inner.ns.views();
        serde_json::json!({
            "views": { "npy": views.npy, "ppm": views.ppm, "decoded_only": views.decoded_only,
                        "max_side": views.max_side },
            "threads": self.opts.threads, "ahead_files": self.opts.ahead,
            "decodes": s.decodes.load(Relaxed), "fallback_decodes": s.fallbacks.load(Relaxed),
            "warning_decodes": s.warnings.load(Relaxed),
            "failures": s.failures.load(Relaxed), "hits": s.hits.load(Relaxed),
            "misses": s.misses.load(Relaxed), "joined": s.joined.load(Relaxed),
            "decoded_ahead": s.ahead.load(Relaxed),
            "cache": self.inner.cache.figures(),
            "decode_us": s.decode_time.summary(),
        })
    }
}

impl Inner {
    /// Reads (and checks) the JPEG bytes of `t` into `buf`, then releases their pack pages.
    fn read_jpeg(&self, t: &ViewTarget, buf: &mut Vec<u8>) -> Result<(), FsError> {
        let len = u32::try_from(t.jpeg_size)
            .map_err(|_| FsError::Corrupt("JPEG larger than 4 GiB".into()))?;
        let n = self.ns.read(t.jpeg_ino, 0, len, buf)?.len();
        buf.truncate(n);
        if let Some(range) = self.ns.data_range(t.jpeg_ino) {
            (self.release)(&range);
        }
        Ok(())
    }

    /// Decodes `jpeg` (the bytes of `t`), caches the image and answers everyone waiting on it.
    fn decode(&self, t: ViewTarget, jpeg: &[u8]) {
        let t0 = Instant::now();
        let result = codec::decode_rgb(jpeg, t.denom, t.width, t.height)
            .map_err(|e| FsError::Corrupt(e.to_string()));
        let result = match result {
            Ok(px) => {
                self.stats.decodes.fetch_add(1, Relaxed);
                self.stats.decode_time.record(t0.elapsed());
                if let Some(w) = &px.warning {
                    self.stats.warnings.fetch_add(1, Relaxed);
                    log::info!(
                        "{}: libjpeg warning, pixels kept: {w}",
                        self.ns.path_of(t.jpeg_ino)
                    );
                }
                if px.fallback {
                    self.stats.fallbacks.fetch_add(1, Relaxed);
                    log::info!(
                        "{}: turbojpeg could not decode it; decoded by zune-jpeg",
                        self.ns.path_of(t.jpeg_ino)
                    );
                }
                Ok(Arc::new(px))
            }
            Err(e) => Err(e),
        };
        self.finish(&t, result);
    }

    /// Ends the single flight of `t`: caches a success, logs a failure, answers the waiters.
    fn finish(&self, t: &ViewTarget, result: Result<Arc<Rgb>, FsError>) {
        if let Err(e) = &result {
            self.stats.failures.fetch_add(1, Relaxed);
            log::error!("decode {}: {e}", self.ns.path_of(t.jpeg_ino));
        }
        let key = (t.jpeg_ino - 1) as u32;
        for w in self.cache.complete(key, &result) {
            w(result.clone());
        }
    }
}

/// Answers a READ of view `t` from its decoded pixels.
fn serve(t: &ViewTarget, px: &Rgb, offset: u64, size: u32, reply: Reply) {
    let header = view::header(t.kind, t.width, t.height);
    let h = header.len() as u64;
    if offset >= h {
        // The common case: the slice lies in the pixels, no copy.
        let s = (offset - h).min(px.pixels.len() as u64) as usize;
        let e = (offset - h)
            .saturating_add(u64::from(size))
            .min(px.pixels.len() as u64) as usize;
        reply(Ok(&px.pixels[s..e]));
        return;
    }
    REPLY_BUF.with_borrow_mut(|buf| {
        view::slice_into(&header, &px.pixels, offset, size, buf);
        reply(Ok(buf));
        if buf.capacity() > 1 << 20 {
            *buf = Vec::new();
        }
    });
}
