//! `--offline` for remote datasets: a node that cannot reach the server mounts what its block
//! caches hold whole. Every online open records, in the index directory, the dataset's objects
//! with their pins and the kept index it used (a record per URL and scan options); an offline
//! open reads that record, requires each object the samples come from to have a complete
//! block cache closed cleanly at the recorded ETag, and serves from those caches without a
//! request (any read outside them fails with EIO: none can happen when every cache is whole).

use super::{RemoteDataset, object_name};
use crate::formats::index::{self, RemoteEntry};
use crate::open::OpenOptions;
use crate::storage::block_cache::{self as cache, BlockCache, CacheDir};
use crate::storage::object::source::OfflineObject;
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What an online open of a dataset recorded for a later `--offline` open.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    /// The dataset's URL.
    url: String,
    /// Where its objects' names start (ends with `/`).
    dir: String,
    /// Every object of the dataset with its pin.
    objects: Vec<RemoteEntry>,
    /// The kept index's file name in the index directory.
    kept: String,
}

/// The record's path: one per URL and scan options.
fn record_path(url: &str, args: &OpenOptions, index_dir: &Path) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_64(super::options_key(url, args).as_bytes());
    index_dir.join(format!("remote-{h:016x}.last.json"))
}

/// Records the opened dataset `ds` (objects named from `dir`) for a later offline open.
/// Best effort: a failure is logged, the mount goes on.
pub(super) fn record(ds: &RemoteDataset, dir: &str, args: &OpenOptions, index_dir: &Path) {
    let rec = Record {
        url: ds.url.clone(),
        dir: dir.to_string(),
        objects: ds.objects.clone(),
        kept: (ds.foreign.path.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let path = record_path(&ds.url, args, index_dir);
    let res = serde_json::to_vec(&rec)
        .map_err(anyhow::Error::from)
        .and_then(|b| {
            let mut tmp = tempfile::NamedTempFile::new_in(index_dir)?;
            std::io::Write::write_all(&mut tmp, &b)?;
            tmp.persist(&path)?;
            Ok(())
        });
    if let Err(e) = res {
        log::warn!("cannot record {} for --offline: {e:#}", path.display());
    }
}

/// Opens the dataset at `url` from its block caches alone (see the module note).
///
/// Errors: this node never opened the URL online with these options; the kept index is gone
/// or damaged; an object's cache is missing, locked (mounted now), incomplete or was not closed
/// cleanly (each named, with what to do).
pub(super) fn open(
    url: &str,
    args: &OpenOptions,
    store: Arc<dyn crate::storage::object::source::ObjectStore>,
) -> Result<RemoteDataset> {
    let index_dir = index::cache_dir(args.index_dir.as_deref());
    let path = record_path(url, args, &index_dir);
    let bytes = std::fs::read(&path).map_err(|_| {
        anyhow!(
            "{url}: --offline, but this node never mounted it online with these options (no {}): mount it online first",
            path.display()
        )
    })?;
    let rec: Record = serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: damaged record", path.display()))?;
    if rec.url != url || rec.kept.contains('/') {
        bail!("{}: the record of another URL", path.display());
    }
    let kept = index_dir.join(&rec.kept);
    let foreign = index::load(&kept)
        .with_context(|| format!("{url}: --offline, but its kept index {}", kept.display()))?;
    if !super::fits(&foreign, args)? {
        bail!(
            "{url}: --offline with decoded views, but its kept index {} was built from the format's tables alone (no JPEG dimensions): mount it online with these options first",
            kept.display()
        );
    }
    let root = (args.remote.cache_dir.clone()).unwrap_or_else(cache::default_root);
    cache::check_root(&root)
        .with_context(|| format!("cannot use the cache root {}", root.display()))?;
    // Every shard the samples come from, once each, its cache whole: all failures named.
    let names: Vec<String> = rec.objects.iter().map(|e| e.name.clone()).collect();
    let mut whole = std::collections::HashMap::new();
    let mut why = Vec::new();
    for o in &foreign.header.objects {
        let Some(i) =
            object_name(&foreign.header, o).and_then(|n| names.iter().position(|m| *m == n))
        else {
            bail!("{}: names an object it does not record", kept.display());
        };
        if whole.contains_key(&i) || why.iter().any(|(k, _)| *k == i) {
            continue;
        }
        let e = &rec.objects[i];
        match whole_cache(&format!("{}{}", rec.dir, e.name), e, &root) {
            Ok(c) => {
                whole.insert(i, Arc::new(c));
            }
            Err(err) => why.push((i, format!("{}: {err:#}", e.name))),
        }
    }
    if !why.is_empty() {
        let why: Vec<String> = why.into_iter().map(|(_, w)| w).collect();
        bail!(
            "{url}: --offline needs every shard's block cache complete and closed cleanly (`loosefs warm MNT --wait` while online, then unmount); not so:\n  {}",
            why.join("\n  ")
        );
    }
    let (files, file_of) = super::files_of(&foreign, &names, |i| {
        whole.get(&i).cloned().context("an object opened twice")
    })
    .map_err(|e| anyhow!("{}: {e:#}", kept.display()))?;
    log::info!("{url}: mounted --offline from {}", root.display());
    Ok(RemoteDataset {
        url: url.to_string(),
        foreign,
        files,
        file_of,
        root,
        objects: rec.objects,
        store,
        open_requests: 0,
        open_bytes: 0,
    })
}

/// The block cache of the object at `url` as `e` pinned it, when it holds every block and
/// was closed cleanly; served without requests.
fn whole_cache(url: &str, e: &RemoteEntry, root: &Path) -> Result<BlockCache> {
    let d = cache::cache_dir(root, url, &e.etag, e.version.as_deref());
    if !d.is_dir() {
        bail!("no block cache of it at this ETag");
    }
    let dir = CacheDir::lock(&d).context("no block cache, or it is mounted now")?;
    if !cache::complete_on_disk(&dir, e.size, &(0..e.size))? {
        bail!("not complete or not closed cleanly");
    }
    let pin = super::pin_of(e);
    // Room for every block: nothing cached may be evicted.
    let limit = (e.size.div_ceil(cache::BLOCK) * cache::BLOCK).max(cache::MIN_CACHE);
    let source = Arc::new(OfflineObject::new(url, pin)?);
    BlockCache::open(source, dir, limit)
        .with_context(|| format!("cannot open the block cache {}", d.display()))
}
