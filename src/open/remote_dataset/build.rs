//! Builds a remote dataset's index on first mount. One zip or FFCV object is indexed from its
//! tables alone where they suffice (the zip end record and central directory; the FFCV
//! header, metadata and allocation tables): only the block-cache blocks holding them are
//! fetched, and no sample is read (`verify=table`: no JPEG dimensions, so not when decoded
//! views are asked, nor with `--verify full`). Otherwise every object is downloaded into its
//! block cache. Either way the cached copies are linked under their names and scanned by the
//! local parsers.

use crate::formats::index::{self, Foreign};
use crate::formats::{Format, ScanOptions, Verify};
use crate::open::OpenOptions;
use crate::storage::Storage;
use crate::storage::block_cache::BlockCache;
use anyhow::{Context, Result, anyhow, bail};
use std::path::Path;
use std::sync::Arc;

/// Builds the index: the cached copies (sparse until fetched) linked under their names in
/// `view` (in the cache root: same file system); then the tables of one zip or FFCV object
/// fetched and scanned ([`tables`]), or every object downloaded (concurrently) and `src` (the
/// view, or its one object) scanned by the local parsers; the index kept at `kept`. `view` is
/// removed after.
pub(super) fn build(
    url: &str,
    names: &[String],
    caches: &[Arc<BlockCache>],
    (view, src): (&Path, &Path),
    kept: &Path,
    args: &OpenOptions,
    progress: crate::progress::Progress,
) -> Result<Foreign> {
    let _ = std::fs::remove_dir_all(view);
    let res = link(view, names, caches).and_then(|()| {
        let mut opts = args.scan_options()?;
        opts.shared_index = crate::formats::SharedIndex::Off;
        if src != view {
            match tables(&caches[0], src, &opts) {
                Ok(format) => {
                    progress.note(&format!("indexing {url} once from its tables alone"));
                    let tabled = ScanOptions {
                        format: Some(format),
                        tables_only: true,
                        ..opts.clone()
                    };
                    match scan(src, &tabled, kept, progress) {
                        Ok(f) => return Ok(f),
                        Err(e) => log::info!("{url}: not indexed from its tables: {e:#}"),
                    }
                }
                Err(why) => log::info!("{url}: not indexed from its tables: {why}"),
            }
        }
        download_all(url, caches, args, progress)?;
        scan(src, &opts, kept, progress)
    });
    let _ = std::fs::remove_dir_all(view);
    let mut f = res.with_context(|| format!("cannot index {url}"))?;
    f.path = kept.to_path_buf();
    Ok(f)
}

/// Links every object's cached copy (its block cache's data file, as long as the object and
/// sparse until fetched) under its name in `view`.
fn link(view: &Path, names: &[String], caches: &[Arc<BlockCache>]) -> Result<()> {
    for (n, c) in names.iter().zip(caches) {
        let to = view.join(n);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::hard_link(c.data_path(), &to).with_context(|| {
            format!(
                "cannot link {} to {}",
                c.data_path().display(),
                to.display()
            )
        })?;
    }
    Ok(())
}

/// Scans `src` with `opts` and keeps the index at `kept` (built beside it, then renamed).
fn scan(
    src: &Path,
    opts: &ScanOptions,
    kept: &Path,
    progress: crate::progress::Progress,
) -> Result<Foreign> {
    let tmp = kept.with_extension("building");
    let _ = std::fs::remove_dir_all(&tmp);
    let res = index::open(src, opts, Some(&tmp), progress).and_then(|f| {
        std::fs::rename(&f.path, kept)
            .with_context(|| format!("cannot keep the index at {}", kept.display()))?;
        Ok(f)
    });
    let _ = std::fs::remove_dir_all(&tmp);
    res
}

/// Fetches the tables of the one object `src` (cached by `cache`) when it is a zip or an FFCV
/// file and `opts` can do without JPEG dimensions (lazy verify, no decoded views): its first
/// block and its last [`crate::formats::zip::table::TAIL`] bytes together, then the central
/// directory, or the metadata and allocation tables.
/// Returns its format; `Err`: why it must be downloaded whole instead.
fn tables(cache: &BlockCache, src: &Path, opts: &ScanOptions) -> Result<Format, String> {
    if opts.verify != Verify::Lazy || opts.views {
        return Err("JPEG dimensions or every CRC-32 asked: every sample is read".into());
    }
    let len = cache.len(0);
    let mut read = |off: u64, n: usize| {
        cache.download_range(off..off.saturating_add(n as u64))?;
        crate::formats::read_at(src, off, n)
    };
    // In one round trip: the first block (what detecting the format reads, an FFCV file's
    // header and field descriptors) and the end (a zip's end record; Parquet's magic).
    let tail = crate::formats::zip::table::TAIL;
    let first = crate::storage::block_cache::BLOCK;
    (cache.download_ranges(&[0..first, len.saturating_sub(tail)..len]))
        .map_err(|e| e.to_string())?;
    let format = match opts.format {
        Some(f) => f,
        None => crate::formats::detect(src).map_err(|e| format!("{e:#}"))?,
    };
    let ranges = match format {
        Format::Zip => {
            use crate::formats::zip::table::{LOCAL_CHECKED, directory};
            let d = directory(&mut read, len)?;
            // The directory, and the local headers just before it that the scan checks.
            let cd = d.start.saturating_sub(LOCAL_CHECKED)..d.start + d.len;
            vec![cd]
        }
        Format::Ffcv => {
            let head = read(0, crate::formats::ffcv::HEAD_MAX).map_err(|e| e.to_string())?;
            crate::formats::ffcv::table_ranges(&head, len)?
        }
        f => return Err(format!("{} records no table of its samples", f.name())),
    };
    for r in ranges {
        cache.download_range(r).map_err(|e| e.to_string())?;
    }
    Ok(format)
}

/// Downloads every object whole into its block cache, `max_requests` objects at a time (each
/// object's own GETs are merged and run concurrently within the shared request limit).
fn download_all(
    url: &str,
    caches: &[Arc<BlockCache>],
    args: &OpenOptions,
    progress: crate::progress::Progress,
) -> Result<()> {
    let total: u64 = caches.iter().map(|c| c.len(0)).sum();
    let room: u64 = caches.iter().map(|c| c.limit()).sum();
    if caches.iter().any(|c| c.limit() < c.len(0)) {
        bail!(
            "{url}: indexing reads every object once through the block cache, which needs {total} bytes but holds {room} (--cache-size, or the free space of the cache root); give more, or mount with --index from a `loosefs index` run elsewhere"
        );
    }
    progress.note(&format!(
        "indexing {url} once: downloading {} objects ({total} bytes) into the block cache",
        caches.len()
    ));
    let meter = progress.meter("download", crate::progress::Unit::Bytes, Some(total));
    let max_requests = args.remote.max_requests;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..max_requests.clamp(1, 16).min(caches.len()) {
            s.spawn(|| {
                while let Some(c) =
                    caches.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    let downloaded = c.download();
                    meter.inc(c.len(0));
                    if let Err(e) = downloaded {
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(anyhow!("cannot download: {e}")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
