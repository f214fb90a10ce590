//! The data backend: serves the bytes of catalog files. Stored bytes go through read-ahead and
//! checked reads; decoded views go to the decoder. It also empties every cache it owns on
//! `drop-cache`.

use crate::catalog::{Extent, FsError, Transform};
use crate::decode::{Decoder, ViewTarget};
use crate::ino::record_ino;
use crate::readahead::ReadAhead;
use crate::report::DropCacheReport;
use crate::samples::Samples;
use crate::stats::Stats;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// Largest read buffer a FUSE thread keeps between requests, bytes (a FUSE read is at most
/// 1 MiB with the default `max_pages`).
const MAX_KEPT_BUF: usize = 1 << 20;
/// Made files after the one read, in an announced order, whose GOPs are decoded ahead.
const FRAMES_AHEAD: usize = 16;

thread_local! {
    /// Per-thread read buffer: at most one request (or one check chunk) per FUSE thread.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Stored samples, their read-ahead and the decoder of their views.
pub(super) struct Data {
    pub(super) samples: Arc<Samples>,
    pub(super) readahead: Arc<ReadAhead>,
    pub(super) decoder: Option<Decoder>,
    /// The server of made files (video frames, columns), when the catalog shows any.
    pub(super) frames: Option<Arc<crate::video::frames::FrameServer>>,
}

impl Data {
    /// The original file of `ext` for a passthrough open, with read-ahead told; `None` when
    /// the bytes are not a whole local file (see [`Samples::backing`]).
    pub(super) fn backing(&self, ext: &Extent) -> Result<Option<Arc<std::fs::File>>, FsError> {
        if ext.transform != Transform::Identity {
            return Ok(None);
        }
        let f = self.samples.backing(ext)?;
        if f.is_some() {
            self.readahead.opened(ext);
        }
        Ok(f)
    }

    /// Answers a READ of `[offset, offset+size)` of file `ino`, whose bytes are `ext`: stored
    /// bytes before returning, a decoded view possibly later from a decode thread (only that
    /// case boxes the reply).
    pub(super) fn read(
        &self,
        ino: u64,
        ext: Extent,
        offset: u64,
        size: u32,
        stats: &Stats,
        reply: impl FnOnce(Result<&[u8], FsError>) + Send + 'static,
    ) {
        match ext.transform {
            Transform::Identity => self.read_stored(&ext, offset, size, stats, reply),
            Transform::Pixels(geom) => self.read_pixels(&ext, geom, offset, size, stats, reply),
            Transform::Made(id) => match &self.frames {
                Some(f) => {
                    stats.bytes_served.fetch_add(
                        f.size(id).saturating_sub(offset).min(u64::from(size)),
                        Relaxed,
                    );
                    f.read(id, offset, size, Box::new(reply));
                    // A reader following an announced order: the GOPs of the frames after
                    // this one in it, decoded ahead.
                    if offset == 0 {
                        let catalog = self.samples.catalog();
                        for r in self.readahead.order_ahead(ext.record, FRAMES_AHEAD) {
                            if let Ok(Extent {
                                transform: Transform::Made(next),
                                ..
                            }) = catalog.extent(record_ino(r))
                            {
                                f.prefetch(next);
                            }
                        }
                    }
                }
                None => reply(Err(FsError::Internal("no frame server".into()))),
            },
            Transform::Decode(geom) => match &self.decoder {
                Some(d) => d.read(
                    ViewTarget {
                        ino,
                        jpeg: ext,
                        geom,
                    },
                    offset,
                    size,
                    Box::new(reply),
                ),
                None => reply(Err(FsError::Internal(
                    "the decode threads are not running".into(),
                ))),
            },
        }
    }

    /// Bytes `[offset, offset + size)` of a view of raw stored pixels: the header made here,
    /// the pixels read (and checked) from storage.
    fn read_pixels(
        &self,
        ext: &Extent,
        geom: crate::view::ViewGeom,
        offset: u64,
        size: u32,
        stats: &Stats,
        reply: impl FnOnce(Result<&[u8], FsError>),
    ) {
        let header = geom.header();
        let hl = header.len() as u64;
        let end = offset.saturating_add(u64::from(size)).min(hl + ext.len());
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        if offset < hl {
            out.extend_from_slice(&header[offset as usize..end.min(hl) as usize]);
        }
        if end > hl {
            let from = offset.max(hl) - hl;
            let n = (end - hl - from) as u32;
            let mut failed = None;
            self.read_stored(ext, from, n, stats, |r| match r {
                Ok(b) => out.extend_from_slice(b),
                Err(e) => failed = Some(e),
            });
            if let Some(e) = failed {
                return reply(Err(e));
            }
        }
        reply(Ok(&out));
    }

    /// Stored bytes: read-ahead bookkeeping, a checked read, release of what was served. A
    /// read at or past the sample's end (the kernel asks at EOF) reads nothing.
    fn read_stored(
        &self,
        ext: &Extent,
        offset: u64,
        size: u32,
        stats: &Stats,
        reply: impl FnOnce(Result<&[u8], FsError>),
    ) {
        if offset >= ext.len() {
            return reply(Ok(&[]));
        }
        self.readahead.before_read(ext, offset, size);
        READ_BUF.with_borrow_mut(|buf| {
            let out = self.samples.read_extent(ext, offset, size, buf);
            match &out {
                Ok(b) => {
                    stats.bytes_served.fetch_add(b.len() as u64, Relaxed);
                    self.readahead
                        .after_read(ext, offset..offset + b.len() as u64);
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Relaxed);
                    if matches!(e, FsError::Stale(_)) {
                        stats.stale.fetch_add(1, Relaxed);
                    }
                }
            }
            reply(out);
            // A check of a large sample may have grown the buffer; keep at most 1 MiB per thread.
            if buf.capacity() > MAX_KEPT_BUF {
                *buf = Vec::new();
            }
        });
    }

    /// Empties the caches of the data path and evicts the unpinned stored pages; `invalidate`
    /// drops the kernel's cached pages of every file served so far.
    pub(super) fn drop_cache(
        &self,
        invalidate: Option<&(dyn Fn(u64) + Send + Sync)>,
    ) -> DropCacheReport {
        let mut r = self.readahead.drop_cache();
        let views = self.decoder.as_ref().map(|d| d.clear()).unwrap_or_default();
        if let Some(f) = &self.frames {
            f.drop_cache();
        }
        if let Some(inv) = invalidate {
            for ino in self.samples.served().map(record_ino).chain(views) {
                inv(ino);
                r.inodes_invalidated += 1;
            }
        }
        r
    }
}
