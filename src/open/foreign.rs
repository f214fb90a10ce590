//! A dataset in another packed format on local disk (WebDataset, MDS, LitData, FFCV, Parquet,
//! GulpIO, TFRecord, zip): its kept index ([`crate::formats::index`]) over its own files,
//! read through the page cache, compressed chunks decompressed into a bounded cache.

use crate::catalog::Catalog;
use crate::catalog::native::NativeCatalog;
use crate::formats::index::Foreign;
use crate::storage::Storage;
use crate::storage::chunks::{MixedStorage, Part};
use crate::storage::local::{LocalObject, LocalStorage};
use crate::view::Views;
use anyhow::{Result, anyhow};
use std::sync::Arc;

/// What the filesystem needs to serve the opened dataset `f`, showing `views`. Errors: a
/// file cannot be opened or mapped, or the index does not fit the files.
pub(super) fn opened(f: &Foreign, views: Views, chunk_cache: u64) -> Result<super::Opened> {
    let storage = storage_of(f, chunk_cache)?;
    let cat = NativeCatalog::with_objects(
        f.map.clone(),
        f.index.clone(),
        f.objects(),
        f.header.bases.clone(),
        views,
    )
    .map_err(|e| anyhow!("{}: {e}", f.header.source.display()))?;
    let catalog: Arc<dyn Catalog> = Arc::new(cat);
    Ok(super::Opened {
        catalog,
        storage,
        owner: super::metadata(&f.header.source)?,
        lease: None,
        files: super::Files::Packed,
    })
}

/// The storage of a foreign dataset's files: local files through the page cache, and its
/// compressed chunks (if any) decompressed into a cache of at most `chunk_cache` bytes.
/// Errors: a file cannot be opened or mapped.
pub fn storage_of(f: &Foreign, chunk_cache: u64) -> std::io::Result<Arc<dyn Storage>> {
    let chunked = f.header.objects.iter().any(|o| o.chunk.is_some());
    let handles = crate::formats::open_files(
        f.header
            .objects
            .iter()
            .filter(|o| o.chunk.is_some())
            .map(|o| o.path.as_path()),
    )?;
    let mut objs = Vec::with_capacity(f.header.objects.len());
    let mut parts = Vec::with_capacity(f.header.objects.len());
    for o in &f.header.objects {
        if let Some(c) = &o.chunk {
            parts.push(Part::Chunk(c.with_file(&o.path, handles[&o.path].clone())));
            continue;
        }
        let file = std::fs::File::open(&o.path)?;
        // SAFETY: a read-only map of a dataset file; files must not change while mounted
        // (their size and mtime keyed the index).
        let map = unsafe { memmap2::Mmap::map(&file)? };
        let obj = LocalObject::new(file, Arc::new(map));
        if chunked {
            parts.push(Part::Plain(obj));
        } else {
            objs.push(obj);
        }
    }
    Ok(if chunked {
        MixedStorage::new(parts, chunk_cache)
    } else {
        Arc::new(LocalStorage::new(objs))
    })
}
