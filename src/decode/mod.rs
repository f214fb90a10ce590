//! On-the-fly decode: serves decoded views (`.npy`, PPM) of JPEG samples.
//!
//! A READ of a view is answered from the decoded cache when the image is there (on the FUSE
//! thread: a copy of the slice asked for). Otherwise the read joins the single flight of that
//! sample ([`cache::DecodedCache::join`]): the first miss reads the JPEG's bytes (on the FUSE
//! thread, which may wait for the disk: decode threads never do) and hands the decode to a pool
//! of `threads` decode threads (turbojpeg, [`codec`]), so a FUSE thread never decodes; every
//! read queued on the sample is answered from the pool when the image is ready.
//! A read at the start of a view that continues a stream of reads in storage order (as
//! [`ReadAhead::walk`] judges it) is taken as an in-order reader: the next `ahead` JPEGs in
//! storage order are asked from the storage and decoded ahead.

pub mod cache;
pub mod codec;

use crate::catalog::{Catalog, Extent, FsError, Transform};
use crate::ino::{Bitset, Node, record_ino};
use crate::readahead::ReadAhead;
use crate::report::{DecodeReport, ViewsReport};
use crate::samples::Samples;
use crate::stats::Histogram;
use crate::view::{ViewGeom, ViewKind};
use cache::{DecodedCache, Join, Waiter};
use codec::Rgb;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Decode settings (`loosefs mount --decode-cache --decode-threads --decode-ahead`).
#[derive(Debug, Clone, Copy)]
pub struct DecodeOptions {
    /// Budget of the decoded cache, bytes of pixels.
    pub cache_bytes: u64,
    /// Budget of the decoded-GOP cache of video frames, bytes of pixels.
    pub frame_cache_bytes: u64,
    /// Decode threads.
    pub threads: usize,
    /// Files decoded ahead of an in-order reader.
    pub ahead: usize,
    /// Serve libjpeg's recovery of truncated or corrupt JPEGs instead of EIO.
    pub accept_damaged: bool,
}

impl DecodeOptions {
    /// What the codec accepts under these options: damaged images only when asked, and no
    /// image larger than the decoded cache's budget.
    pub fn policy(&self) -> codec::Policy {
        codec::Policy {
            accept_damaged: self.accept_damaged,
            max_bytes: self.cache_bytes.min(codec::MAX_DECODED_BYTES),
        }
    }
}

/// The answer to a READ: called once, on whatever thread has the bytes.
pub type Reply = Box<dyn FnOnce(Result<&[u8], FsError>) + Send>;

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
    /// Of those, damaged JPEGs refused (truncated or corrupt scans).
    pub damaged: AtomicU64,
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

/// One decoded view being served: its inode, the JPEG's stored bytes and the view's shape.
#[derive(Debug, Clone)]
pub struct ViewTarget {
    /// Inode of the view.
    pub ino: u64,
    /// Where the JPEG's bytes are.
    pub jpeg: Extent,
    /// What to decode them into.
    pub geom: ViewGeom,
}

impl ViewTarget {
    /// The view behind `ino` with extent `ext`, `None` when `ext` is not a decoded view.
    pub fn new(ino: u64, ext: Extent) -> Option<ViewTarget> {
        match ext.transform {
            Transform::Decode(geom) => Some(ViewTarget {
                ino,
                jpeg: ext,
                geom,
            }),
            Transform::Identity | Transform::Pixels(_) | Transform::Made(_) => None,
        }
    }
}

struct PoolShared {
    samples: Arc<Samples>,
    readahead: Arc<ReadAhead>,
    cache: DecodedCache,
    stats: DecodeStats,
    /// Records whose npy (0) and ppm (1) views were served since the last [`Decoder::clear`]
    /// (for page-cache invalidation).
    served: [Bitset; 2],
    /// Records whose JPEG could not be decoded: logged once, answered EIO at once after that.
    undecodable: Bitset,
    /// What the codec accepts.
    policy: codec::Policy,
}

/// The decode service of a mount.
pub struct Decoder {
    inner: Arc<PoolShared>,
    pool: rayon::ThreadPool,
    opts: DecodeOptions,
}

thread_local! {
    /// JPEG bytes of the sample being decoded, per decode thread.
    static JPEG_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Bytes of a reply that spans the header, per thread.
    static REPLY_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Decoder {
    /// Starts the decode pool. Errors: the threads cannot be spawned.
    pub fn new(
        samples: Arc<Samples>,
        readahead: Arc<ReadAhead>,
        opts: DecodeOptions,
    ) -> std::io::Result<Decoder> {
        let records = samples.catalog().records();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads.max(1))
            .thread_name(|i| format!("loosefs-decode-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Decoder {
            inner: Arc::new(PoolShared {
                samples,
                readahead,
                cache: DecodedCache::new(opts.cache_bytes),
                stats: DecodeStats::default(),
                served: [Bitset::new(records), Bitset::new(records)],
                undecodable: Bitset::new(records),
                policy: opts.policy(),
            }),
            pool,
            opts,
        })
    }

    /// Answers a READ of `[offset, offset+size)` of view `t` through `reply`, now (cached) or
    /// from a decode thread.
    pub fn read(&self, t: ViewTarget, offset: u64, size: u32, reply: Reply) {
        let inner = &self.inner;
        if inner.undecodable.contains(t.jpeg.record) {
            inner.stats.failures.fetch_add(1, Relaxed);
            reply(Err(FsError::Corrupt(
                "the JPEG cannot be decoded (logged)".into(),
            )));
            return;
        }
        inner.served[t.geom.kind as usize].insert(t.jpeg.record);
        if offset == 0 {
            let a = inner.readahead.walk(&t.jpeg);
            let catalog = inner.samples.catalog();
            if a.continues {
                // An in-order reader: the views after `t` in storage order.
                let mut cur = record_ino(t.jpeg.record);
                let next = std::iter::from_fn(|| {
                    cur = catalog.next_file(cur)?;
                    Some(cur)
                });
                self.decode_ahead(&t, next.take(self.opts.ahead));
            } else if a.followed {
                // A reader following an announced order: the views after `t` in that order.
                let next = (inner.readahead.order_ahead(t.jpeg.record, self.opts.ahead))
                    .into_iter()
                    .map(record_ino);
                self.decode_ahead(&t, next);
            }
        }
        let key = t.jpeg.record;
        if let Some(px) = inner.cache.get(key) {
            inner.stats.hits.fetch_add(1, Relaxed);
            serve(t.geom, &px, offset, size, reply);
            return;
        }
        let geom = t.geom;
        let waiter: Waiter = Box::new(move |r| match r {
            Ok(px) => serve(geom, &px, offset, size, reply),
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
                        self.pool.spawn(move || inner.decode(&t, &jpeg));
                    }
                    Err(e) => inner.finish(&t, Err(e)),
                }
            }
        }
    }

    /// Decodes the views of `t`'s kind of the JPEG inodes `next` (the files a reader at `t`
    /// reads next), while fewer decodes than the pool's threads twice plus the look-ahead are
    /// in flight.
    fn decode_ahead(&self, t: &ViewTarget, next: impl Iterator<Item = u64>) {
        let inner = &self.inner;
        let catalog = inner.samples.catalog();
        for n in next {
            if inner.cache.in_flight() >= 2 * self.opts.threads.max(1) + self.opts.ahead {
                return;
            }
            let Some(nt) = view_of(catalog.as_ref(), t.geom.kind, n) else {
                continue;
            };
            if inner.undecodable.contains(nt.jpeg.record) {
                continue;
            }
            if inner.cache.start(nt.jpeg.record) {
                inner.stats.ahead.fetch_add(1, Relaxed);
                inner.readahead.will_need(&nt.jpeg);
                let inner = self.inner.clone();
                self.pool.spawn(move || {
                    JPEG_BUF.with_borrow_mut(|buf| {
                        match inner.read_jpeg(&nt, buf) {
                            Ok(()) => inner.decode(&nt, buf),
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

    /// Drops every decoded image; returns the view inodes served since the last clear.
    pub fn clear(&self) -> Vec<u64> {
        self.inner.cache.clear();
        let [npy, ppm] = &self.inner.served;
        let npy = npy.take().into_iter().map(|r| Node::Npy(r).ino());
        npy.chain(ppm.take().into_iter().map(record_ino)).collect()
    }

    /// The `decode` section of the stats report.
    pub fn report(&self) -> DecodeReport {
        let s = &self.inner.stats;
        let views = self.inner.samples.catalog().views();
        DecodeReport {
            views: ViewsReport {
                npy: views.npy,
                ppm: views.ppm,
                decoded_only: views.decoded_only,
                max_side: views.max_side,
            },
            threads: self.opts.threads,
            ahead_files: self.opts.ahead,
            decodes: s.decodes.load(Relaxed),
            fallback_decodes: s.fallbacks.load(Relaxed),
            warning_decodes: s.warnings.load(Relaxed),
            failures: s.failures.load(Relaxed),
            damaged_refused: s.damaged.load(Relaxed),
            accept_damaged: self.opts.accept_damaged,
            hits: s.hits.load(Relaxed),
            misses: s.misses.load(Relaxed),
            joined: s.joined.load(Relaxed),
            decoded_ahead: s.ahead.load(Relaxed),
            cache: self.inner.cache.figures(),
            decode_us: s.decode_time.summary(),
        }
    }
}

/// The view of kind `kind` of file `ino`, `None` when it has none (not a JPEG).
fn view_of(catalog: &dyn Catalog, kind: ViewKind, ino: u64) -> Option<ViewTarget> {
    let rec = Node::of(ino)?.record()?;
    let ino = match kind {
        ViewKind::Npy => Node::Npy(rec).ino(),
        ViewKind::Ppm => ino,
    };
    ViewTarget::new(ino, catalog.extent(ino).ok()?)
}

impl PoolShared {
    /// Reads (and checks) the JPEG bytes of `t` into `buf`, then releases their pack pages.
    fn read_jpeg(&self, t: &ViewTarget, buf: &mut Vec<u8>) -> Result<(), FsError> {
        let len = u32::try_from(t.jpeg.len())
            .map_err(|_| FsError::Corrupt("JPEG larger than 4 GiB".into()))?;
        let n = self.samples.read_extent(&t.jpeg, 0, len, buf)?.len();
        buf.truncate(n);
        self.readahead.release_served(&t.jpeg, 0..t.jpeg.len());
        Ok(())
    }

    fn path(&self, t: &ViewTarget) -> String {
        self.samples.catalog().path_of(record_ino(t.jpeg.record))
    }

    /// Decodes `jpeg` (the bytes of `t`), caches the image and answers everyone waiting on it.
    fn decode(&self, t: &ViewTarget, jpeg: &[u8]) {
        let t0 = Instant::now();
        let (denom, width, height) = (t.geom.denom, t.geom.width, t.geom.height);
        let result = codec::decode_checked(jpeg, denom, width, height, self.policy).map_err(|e| {
            if matches!(e, codec::DecodeError::Damaged { .. }) {
                self.stats.damaged.fetch_add(1, Relaxed);
            }
            FsError::Corrupt(e.to_string())
        });
        let result = match result {
            Ok(px) => {
                self.stats.decodes.fetch_add(1, Relaxed);
                self.stats.decode_time.record(t0.elapsed());
                if let Some(w) = &px.warning {
                    self.stats.warnings.fetch_add(1, Relaxed);
                    log::info!("{}: libjpeg warning, pixels kept: {w}", self.path(t));
                }
                if px.fallback {
                    self.stats.fallbacks.fetch_add(1, Relaxed);
                    log::info!(
                        "{}: turbojpeg could not decode it; decoded by zune-jpeg",
                        self.path(t)
                    );
                }
                Ok(Arc::new(px))
            }
            Err(e) => {
                if !self.undecodable.insert(t.jpeg.record) {
                    log::error!("decode {}: {e}; answering EIO", self.path(t));
                }
                Err(e)
            }
        };
        self.finish(t, result);
    }

    /// Ends the single flight of `t`: caches a success, logs a failure, answers the waiters.
    fn finish(&self, t: &ViewTarget, result: Result<Arc<Rgb>, FsError>) {
        if result.is_err() {
            self.stats.failures.fetch_add(1, Relaxed); // logged where it was found
        }
        for w in self.cache.complete(t.jpeg.record, &result) {
            w(result.clone());
        }
    }
}

/// Answers a READ of a view shaped `geom` from its decoded pixels.
fn serve(geom: ViewGeom, px: &Rgb, offset: u64, size: u32, reply: Reply) {
    let header = geom.header();
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
        crate::view::slice_into(&header, &px.pixels, offset, size, buf);
        reply(Ok(buf));
        if buf.capacity() > 1 << 20 {
            *buf = Vec::new();
        }
    });
}
