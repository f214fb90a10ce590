//! What `mount`, `info` and `pack` open: a native loosefs pack, or a dataset in another packed
//! format served through its kept index ([`crate::formats::index`]). Both end as the same
//! catalog type over local storage, so the read path (read-ahead, warm, pin, views, stats)
//! does not know which it serves.

use crate::catalog::native::NativeCatalog;
use crate::formats::index::Foreign;
use crate::fs::Fs;
use crate::loose::LooseDir;
use crate::options::{FsOptions, SourceArgs};
use crate::pack::FormatError;
use crate::pack::reader::Pack;
use crate::remote::RemotePack;
use crate::remote_dataset::RemoteDataset;
use crate::storage::chunks::{MixedStorage, Part};
use crate::storage::local::{LocalObject, LocalStorage};
use crate::view::Views;
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::sync::Arc;

/// An opened source.
#[derive(Debug)]
pub enum Dataset {
    /// A native pack.
    Pack(Pack),
    /// Another format, through its index.
    Foreign(Foreign),
    /// A native pack at an `s3://` or `https://` URL, through its block cache.
    Remote(RemotePack),
    /// A loose dataset directory, served in place.
    Dir(LooseDir),
    /// A foreign dataset at an `s3://` or `https://` URL, one block cache per object.
    RemoteSet(Box<RemoteDataset>),
}

/// The last 64 KiB of `src` (less when it is shorter; empty when it cannot be read).
fn tail_of(src: &Path) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut tail = Vec::new();
    if let Ok(mut f) = std::fs::File::open(src) {
        let _ = f
            .seek(SeekFrom::End(-(64 << 10)))
            .or_else(|_| f.seek(SeekFrom::Start(0)));
        let _ = f.take(64 << 10).read_to_end(&mut tail);
    }
    tail
}

/// What the end of a zip says it is: `(names the pack index, has an end of central directory)`.
/// The pack index is the last entry of a pack's central directory, so a zip naming it is a pack
/// whose trailer is damaged; a zip without an end record is cut short (perhaps a pack).
fn zip_end(src: &Path) -> (bool, bool) {
    let tail = tail_of(src);
    let has = |name: &[u8]| tail.windows(name.len()).any(|w| w == name);
    (
        has(crate::pack::INDEX_MEMBER.as_bytes()),
        has(b"PK\x05\x06"),
    )
}

impl Dataset {
    /// Opens `src`: a native pack unless `--format` names another format or `src` is a
    /// directory or not a pack; then the format is detected and the kept index loaded or
    /// built (`progress`: say so on stderr).
    ///
    /// Errors: a damaged native pack (its own message); a source in no known format (the
    /// message lists what was tried); a damaged foreign source (names the file).
    pub fn open(src: &Path, args: &SourceArgs, progress: bool) -> Result<Dataset> {
        if let Some(url) = src.to_str().filter(|s| crate::storage::object::is_url(s)) {
            let dataset = || {
                RemoteDataset::open(url, args, progress)
                    .with_context(|| format!("cannot open {url}"))
                    .map(|r| Dataset::RemoteSet(Box::new(r)))
            };
            if args.format.is_some() || crate::remote_dataset::names_many(url) {
                return dataset();
            }
            return match RemotePack::open(url, &args.remote.config()) {
                // One object in another format (a zip, a `.beton`, a Parquet file, a tar).
                // Offline: no GET tells a pack from a dataset; a recorded dataset is tried too.
                Err(e)
                    if format!("{e:#}").contains("not a loosefs pack") || args.remote.offline =>
                {
                    dataset().map_err(|d| anyhow::anyhow!("{d:#}\n  loosefs pack: {e:#}"))
                }
                r => r
                    .with_context(|| format!("cannot open {url}"))
                    .map(Dataset::Remote),
            };
        }
        let opts = args.scan_options()?;
        if opts.format.is_none() && src.is_file() {
            match Pack::open(src) {
                Ok(p) => return Ok(Dataset::Pack(p)),
                Err(FormatError::NotAPack(why)) => {
                    // A file in another format: its own errors name the file and what is
                    // wrong. No format: the pack's reason is one of those tried. A zip cut
                    // short (a truncated pack is one): say why it is not a pack either. A zip whose central directory names the pack
                    // index is a pack with a damaged trailer: refused, not served as a zip.
                    let format = match crate::formats::detect(src) {
                        // The formats tried, each with its reason, the pack among them.
                        Err(e) => bail!("{e:#}\n  loosefs pack: {why}"),
                        Ok(f) => f,
                    };
                    let why = format!("{}: not a loosefs pack ({why})", src.display());
                    let (names_index, whole) = match format {
                        crate::formats::Format::Zip => zip_end(src),
                        _ => (false, true),
                    };
                    if names_index {
                        bail!(
                            "{why}; it holds a pack index ({}): a loosefs pack whose end is damaged. Pack the source again",
                            crate::pack::INDEX_MEMBER
                        );
                    }
                    let r = crate::formats::index::open(
                        src,
                        &opts,
                        args.index_dir.as_deref(),
                        progress,
                    )
                    .map(Dataset::Foreign);
                    return if whole { r } else { r.context(why) };
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot open pack {}", src.display()));
                }
            }
        }
        if opts.format.is_none() && src.is_dir() && !crate::source::foreign_dir(src) {
            return LooseDir::open(src, args.probe_jpegs).map(Dataset::Dir);
        }
        crate::formats::index::open(src, &opts, args.index_dir.as_deref(), progress)
            .map(Dataset::Foreign)
    }

    /// The source's path (a foreign source's canonical path).
    pub fn path(&self) -> &Path {
        match self {
            Dataset::Pack(p) => p.path(),
            Dataset::Foreign(f) => &f.header.source,
            Dataset::Remote(r) => Path::new(r.url()),
            Dataset::Dir(d) => &d.root,
            Dataset::RemoteSet(r) => Path::new(r.url()),
        }
    }

    /// Bytes of every file the samples are read from.
    pub fn stored_bytes(&self) -> u64 {
        match self {
            Dataset::Pack(p) => p.file_len(),
            Dataset::Foreign(f) => f.header.objects.iter().map(|o| o.len).sum(),
            Dataset::Remote(r) => r.size(),
            Dataset::Dir(d) => d.bytes(),
            Dataset::RemoteSet(r) => r.size(),
        }
    }

    /// The server for this source; compressed chunks are kept decompressed within
    /// `chunk_cache` bytes. Errors: a file cannot be opened or mapped.
    pub fn server(self, views: Views, opts: FsOptions, chunk_cache: u64) -> std::io::Result<Fs> {
        match self {
            Dataset::Pack(p) => Fs::local(p, views, opts),
            Dataset::Remote(r) => {
                let cat = r
                    .catalog(views)
                    .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
                Ok(Fs::new(Arc::new(cat), r.storage().clone(), opts))
            }
            Dataset::RemoteSet(r) => {
                let cat = r
                    .catalog(views)
                    .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
                Ok(Fs::new(Arc::new(cat), r.storage(chunk_cache), opts))
            }
            Dataset::Dir(d) => {
                let cat = d
                    .catalog(views)
                    .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
                let cat: Arc<dyn crate::catalog::Catalog> = Arc::new(cat);
                let server = Fs::new(cat.clone(), d.storage(), opts);
                let raw = d
                    .catalog(Views::default())
                    .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
                let changes = crate::loose::changes::Changes::new(
                    d.root.clone(),
                    cat,
                    Arc::new(raw),
                    d.storage(),
                );
                server.set_changes(Arc::new(changes));
                Ok(server)
            }
            Dataset::Foreign(f) => {
                let storage = storage_of(&f, chunk_cache)?;
                let cat = NativeCatalog::with_objects(
                    f.map.clone(),
                    f.index.clone(),
                    f.objects(),
                    f.header.bases.clone(),
                    views,
                )
                .map_err(|e| std::io::Error::other(e.to_string()))?;
                Ok(Fs::new(Arc::new(cat), storage, opts))
            }
        }
    }
}

/// The storage of a foreign dataset's files: local files through the page cache, and its
/// compressed chunks (if any) decompressed into a cache of at most `chunk_cache` bytes.
/// Errors: a file cannot be opened or mapped.
pub fn storage_of(
    f: &Foreign,
    chunk_cache: u64,
) -> std::io::Result<Arc<dyn crate::storage::Storage>> {
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
