//! The block caches of a remote source's objects (a pack is a set of one): locked, then opened
//! within the cache root's budget by one rule, whatever the kind of source.

use crate::storage::block_cache::{self as cache, BlockCache, CacheDir};
use crate::storage::object::source::ObjectSource;
use anyhow::{Context, Result, anyhow};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The cache directories of a set of pinned objects in a cache root, locked (no other mount
/// uses them), not yet given their shares.
pub(crate) struct LockedCaches {
    root: PathBuf,
    objects: Vec<Arc<dyn ObjectSource>>,
    dirs: Vec<CacheDir>,
    /// What the other live mounts of the root hold, bytes (read before locking ours).
    live: u64,
}

impl LockedCaches {
    /// Locks the cache directory of each of `objects` (each pinned) in `root`.
    ///
    /// Errors: the root cannot be used (not a directory, another owner's), an object is not
    /// pinned, a directory is locked by another mount or cannot be made.
    pub(crate) fn lock(root: &Path, objects: Vec<Arc<dyn ObjectSource>>) -> Result<LockedCaches> {
        cache::check_root(root)
            .with_context(|| format!("cannot use the cache root {}", root.display()))?;
        let live = cache::live_shares(root, Path::new(""));
        let mut dirs = Vec::with_capacity(objects.len());
        for o in &objects {
            let p = o
                .pin()
                .ok_or_else(|| anyhow!("{}: not pinned before its cache was opened", o.url()))?;
            let d = cache::cache_dir(root, o.url(), &p.etag, p.version.as_deref());
            dirs.push(
                CacheDir::lock(&d)
                    .with_context(|| format!("cannot use the block cache {}", d.display()))?,
            );
        }
        Ok(LockedCaches {
            root: root.to_path_buf(),
            objects,
            dirs,
            live,
        })
    }

    /// The locked directory of object `i`.
    pub(crate) fn dir(&self, i: usize) -> &CacheDir {
        &self.dirs[i]
    }

    /// Opens a block cache per object within the root's budget (`asked`: `--cache-size`, else
    /// the root's free space, see [`cache::cache_budget`]): each object's share is its size
    /// rounded up to blocks when every object fits beside the live mounts' shares, else a
    /// proportional part of what is left, at least [`cache::MIN_CACHE`]. Unused directories of
    /// other objects are pruned to make room. A set kept smaller than its objects is logged:
    /// blocks will be fetched more than once.
    ///
    /// Errors: a block cache cannot be opened (its file cannot be made or mapped).
    pub(crate) fn open(self, asked: Option<u64>) -> Result<Vec<Arc<BlockCache>>> {
        let sizes: Vec<u64> = (self.objects.iter())
            .map(|o| o.pin().map_or(0, |p| p.size))
            .collect();
        let rounded: Vec<u64> = sizes
            .iter()
            .map(|s| s.div_ceil(cache::BLOCK) * cache::BLOCK)
            .collect();
        let total: u64 = rounded.iter().sum();
        let (budget, _) = cache::cache_budget(&self.root, total, asked);
        let room = budget.saturating_sub(self.live);
        if let Some(d) = self.dirs.first() {
            cache::prune(&self.root, d.path(), budget, total.min(room));
        }
        if total > room {
            log::warn!(
                "{}: the block cache keeps {room} of its {total} bytes (--cache-size, or the free space of {}): blocks will be fetched more than once, and --pin/--warm of the whole source cannot complete",
                self.objects.first().map_or("", |o| o.url()),
                self.root.display()
            );
        }
        let n = self.objects.len() as u64;
        let mut out = Vec::with_capacity(self.objects.len());
        for ((o, dir), r) in self.objects.into_iter().zip(self.dirs).zip(&rounded) {
            let limit = if total <= room {
                *r
            } else {
                (*r as u128 * room as u128 / total.max(1) as u128) as u64
            };
            let limit = limit.max(cache::MIN_CACHE);
            cache::record_share(&dir, limit);
            let path = dir.path().to_path_buf();
            let bc = BlockCache::open(o, dir, limit)
                .with_context(|| format!("cannot open the block cache {}", path.display()))?;
            // The source's exact ranges (a sparse announced order) held in memory: one bound
            // for all its objects, at least 1 MiB each (a few samples).
            bc.set_exact_max((cache::HELD_MAX / n.max(1)).max(1 << 20));
            out.push(Arc::new(bc));
        }
        Ok(out)
    }
}
