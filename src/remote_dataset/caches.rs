//! The block caches of a remote dataset's objects: one per object, sharing the cache root's
//! budget.

use crate::formats::index::Foreign;
use crate::storage::block_cache::{self as cache, BlockCache, CacheDir};
use crate::storage::object::ObjectClient;
use crate::storage::object_source::ObjectSource;
use anyhow::{Context, Result, anyhow};
use std::path::Path;
use std::sync::Arc;

/// A block cache per object in `root`, within the root's budget: each object's share is its
/// size (rounded up to blocks) when every object fits beside the live mounts' shares, else a
/// proportional part of what is left (at least [`cache::MIN_CACHE`]).
pub(super) fn open_caches(
    root: &Path,
    clients: &[Arc<ObjectClient>],
    asked: Option<u64>,
) -> Result<Vec<Arc<BlockCache>>> {
    let rounded: Vec<u64> = clients
        .iter()
        .map(|c| c.pin().expect("opened").size.div_ceil(cache::BLOCK) * cache::BLOCK)
        .collect();
    let total: u64 = rounded.iter().sum();
    let (budget, _) = cache::cache_budget(root, total, asked);
    let live = cache::live_shares(root, Path::new(""));
    let room = budget.saturating_sub(live);
    let mut dirs = Vec::with_capacity(clients.len());
    for c in clients {
        let p = c.pin().expect("opened");
        let d = cache::cache_dir(root, c.url(), &p.etag, p.version.as_deref());
        dirs.push(
            CacheDir::lock(&d)
                .with_context(|| format!("cannot use the block cache {}", d.display()))?,
        );
    }
    cache::prune(root, dirs[0].path(), budget, total.min(room));
    let mut out = Vec::with_capacity(clients.len());
    for ((c, dir), r) in clients.iter().zip(dirs).zip(&rounded) {
        let limit = if total <= room {
            *r
        } else {
            (*r as u128 * room as u128 / total.max(1) as u128) as u64
        };
        let limit = limit.max(cache::MIN_CACHE);
        cache::record_share(&dir, limit);
        let path = dir.path().to_path_buf();
        let source: Arc<dyn ObjectSource> = c.clone();
        let bc = BlockCache::open(source, dir, limit)
            .with_context(|| format!("cannot open the block cache {}", path.display()))?;
        // The dataset's exact ranges (a sparse announced order) held in memory: one bound for
        // all its objects, at least 1 MiB each (a few samples).
        bc.set_exact_max((cache::HELD_MAX / clients.len() as u64).max(1 << 20));
        out.push(Arc::new(bc));
    }
    Ok(out)
}

/// The block caches the index `f`'s objects read, once each (`cache(i)`: that of `names[i]`),
/// and per object of the index its cache among them. Errors: the index names an object the
/// dataset does not hold, or `cache` fails (its message).
pub(super) fn files_of(
    f: &Foreign,
    names: &[String],
    mut cache: impl FnMut(usize) -> Result<Arc<cache::BlockCache>>,
) -> Result<(Vec<Arc<cache::BlockCache>>, Vec<u32>)> {
    let (mut files, mut file_of) = (Vec::new(), Vec::with_capacity(f.header.objects.len()));
    let mut seen = std::collections::HashMap::new();
    for o in &f.header.objects {
        let i = super::object_name(&f.header, o)
            .and_then(|n| names.iter().position(|m| *m == n))
            .ok_or_else(|| anyhow!("names {} which the dataset does not hold", o.path.display()))?;
        let k = match seen.get(&i) {
            Some(&k) => k,
            None => {
                files.push(cache(i)?);
                seen.insert(i, files.len() as u32 - 1);
                files.len() as u32 - 1
            }
        };
        file_of.push(k);
    }
    Ok((files, file_of))
}
