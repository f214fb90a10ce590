//! Builds a remote dataset's index on first mount: every object downloaded into its block
//! cache, the cached copies linked under their names and scanned by the local parsers.

use crate::formats::index::{self, Foreign};
use crate::options::SourceArgs;
use crate::storage::Storage;
use crate::storage::block_cache::BlockCache;
use anyhow::{Context, Result, anyhow, bail};
use std::path::Path;
use std::sync::Arc;

/// Builds the index: every object downloaded into its block cache (concurrently), the
/// cached copies linked under their names in `view` (in the cache root: same file system),
/// `src` (the view, or its one object) scanned by the local parsers, the index kept at
/// `kept`. `view` is removed after.
pub(super) fn build(
    url: &str,
    names: &[String],
    caches: &[Arc<BlockCache>],
    (view, src): (&Path, &Path),
    kept: &Path,
    args: &SourceArgs,
    progress: bool,
) -> Result<Foreign> {
    let total: u64 = caches.iter().map(|c| c.len(0)).sum();
    let room: u64 = caches.iter().map(|c| c.limit()).sum();
    if caches.iter().any(|c| c.limit() < c.len(0)) {
        bail!(
            "{url}: indexing reads every object once through the block cache, which needs {total} bytes but holds {room} (--cache-size, or the free space of the cache root); give more, or mount with --index from a `loosefs index` run elsewhere"
        );
    }
    if progress {
        eprintln!(
            "loosefs: indexing {url} once: downloading {} objects ({total} bytes) into the block cache",
            names.len()
        );
    }
    download_all(caches, args.remote.max_requests)?;
    let _ = std::fs::remove_dir_all(view);
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
    let tmp = kept.with_extension("building");
    let _ = std::fs::remove_dir_all(&tmp);
    let mut opts = args.scan_options()?;
    opts.shared_index = crate::formats::SharedIndex::Off;
    let res = index::open(src, &opts, Some(&tmp), false).and_then(|f| {
        std::fs::rename(&f.path, kept)
            .with_context(|| format!("cannot keep the index at {}", kept.display()))?;
        Ok(f)
    });
    let _ = std::fs::remove_dir_all(view);
    let _ = std::fs::remove_dir_all(&tmp);
    let mut f = res.with_context(|| format!("cannot index {url}"))?;
    f.path = kept.to_path_buf();
    Ok(f)
}

/// Downloads every object whole into its block cache, `max_requests` objects at a time (each
/// object's own GETs are merged and run concurrently within the shared request limit).
fn download_all(caches: &[Arc<BlockCache>], max_requests: usize) -> Result<()> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..max_requests.clamp(1, 16).min(caches.len()) {
            s.spawn(|| {
                while let Some(c) =
                    caches.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    if let Err(e) = c.download() {
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
