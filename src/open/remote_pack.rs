//! Opens a loosefs pack at an `s3://` or `https://` URL in O(1) requests: one suffix GET of
//! the pack's last [`TAIL`] bytes gives its size, its ETag (pinned for the life of the mount)
//! and the trailer locating the index ([`crate::pack::trailer`]: the zip central directory is
//! never fetched); one more GET (in [`INDEX_PART`] parts fetched concurrently when large)
//! brings the index unless the tail already holds it. The index is checked like a local pack's
//! and kept in the object's cache directory (temp + rename), so a remount of the same object
//! costs the one tail GET. The samples are then served through [`BlockCache`].

use super::OpenError;
use super::caches::LockedCaches;
use crate::catalog::ObjectInfo;
use crate::catalog::native::NativeCatalog;
use crate::pack::FormatError;
use crate::pack::index::{IndexView, Totals};
use crate::pack::trailer::Trailer;
use crate::storage::block_cache::{self as cache, BlockCache, CacheDir};
use crate::storage::object::remote_config::RemoteConfig;
use crate::storage::object::source::{ObjectSource, ObjectStore, OfflineObject, Pin};
use crate::view::Views;
use anyhow::{Context, Result, anyhow, bail};
use memmap2::Mmap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes fetched from the end of the object at open: the trailer needs the last 75; a small
/// pack's whole index comes with it.
pub const TAIL: u64 = 1 << 20;
/// Part size of a large index fetched concurrently, bytes.
pub const INDEX_PART: u64 = 8 << 20;

/// An opened remote pack.
#[derive(Debug)]
pub struct RemotePack {
    url: String,
    storage: Arc<BlockCache>,
    index: Arc<Mmap>,
    totals: Totals,
    dir: PathBuf,
    /// GETs made to open it (1: the index came from the cache or the tail).
    pub open_requests: u64,
}

impl RemotePack {
    /// Opens the pack at `url` on `store` (`args`: its block cache; `--offline`: from the
    /// cache alone, no request made).
    ///
    /// Errors: [`OpenError::NotAPack`] for an object without a pack's trailer (another format
    /// may read it); else the URL or options are wrong, the object cannot be read (404, 403,
    /// network, with the server's reason), or its index fails its checks.
    pub fn open(
        url: &str,
        store: &dyn ObjectStore,
        args: &RemoteConfig,
    ) -> Result<RemotePack, OpenError> {
        if args.offline {
            // Whatever keeps the caches from serving it, the source is not available offline.
            return RemotePack::open_offline(url, args).map_err(|e| {
                crate::exit_code::with_kind(e, crate::exit_code::ExitKind::Unavailable).into()
            });
        }
        let client = store.object(url)?;
        let tail = client.open_tail_blocking(TAIL)?;
        let pin = client
            .pin()
            .cloned()
            .ok_or_else(|| anyhow!("{url}: not pinned by its first GET"))?;
        let size = pin.size;
        let trailer = Trailer::parse_tail(&tail).map_err(|e| match e {
            FormatError::NotAPack(why) => OpenError::NotAPack {
                src: url.to_string(),
                why,
            },
            e => anyhow::Error::new(e).context(url.to_string()).into(),
        })?;
        let index_range = trailer
            .index_range(size)
            .map_err(|e| anyhow::Error::new(e).context(url.to_string()))?;
        Ok(RemotePack::open_pinned(
            url,
            client,
            args,
            &tail,
            trailer,
            index_range,
        )?)
    }

    /// The rest of [`RemotePack::open`] once the tail located the index: the index from the
    /// cache directory or fetched, checked; the block cache opened within its budget.
    fn open_pinned(
        url: &str,
        client: Arc<dyn ObjectSource>,
        args: &RemoteConfig,
        tail: &[u8],
        trailer: Trailer,
        index_range: std::ops::Range<u64>,
    ) -> Result<RemotePack> {
        let size = client.pin().context("not pinned")?.size;
        let root = args.cache_dir.clone().unwrap_or_else(cache::default_root);
        let locked = LockedCaches::lock(&root, vec![client.clone()])?;
        let dir = locked.dir(0).path().to_path_buf();
        let mut requests = 1;
        let (map, totals, fetched) = match kept_index(locked.dir(0), trailer.index_len) {
            Some((m, totals)) => (m, totals, false),
            None => {
                let mut anon = memmap2::MmapMut::map_anon(trailer.index_len as usize)?;
                let tail_start = size - tail.len() as u64;
                if index_range.start >= tail_start {
                    let s = (index_range.start - tail_start) as usize;
                    anon.copy_from_slice(&tail[s..s + trailer.index_len as usize]);
                } else {
                    requests += trailer.index_len.div_ceil(INDEX_PART);
                    fetch_parts(&*client, index_range.clone(), &mut anon)?;
                }
                let map = anon.make_read_only()?;
                let totals = IndexView::parse(&map)
                    .with_context(|| format!("{url}: damaged index"))?
                    .totals();
                (map, totals, true)
            }
        };
        IndexView::from_validated(&map, totals)
            .ok_or_else(|| anyhow!("{url}: damaged index (bounds)"))?
            .validate_tree()
            .with_context(|| format!("{url}: damaged index"))?;
        trailer
            .check_data_end(totals.data_end)
            .map_err(|e| anyhow!("{url}: {e}"))?;
        let index = Arc::new(map);
        let writer = fetched.then(|| keep_index(index.clone(), dir.clone()));
        // Mounts of other objects running now keep their shares: this one takes what is left.
        let storage = locked
            .open(args.cache_size)?
            .pop()
            .context("no block cache")?;
        if let Some(w) = writer {
            // Joined when the storage closes (a mount ends) or by `finish`.
            storage.join_on_close(w);
        }
        Ok(RemotePack {
            url: url.to_string(),
            storage,
            index,
            totals,
            dir,
            open_requests: requests,
        })
    }

    /// Opens the pack at `url` from its block cache alone (`--offline`): the cache directory
    /// of the URL that a mount closed cleanly and that holds the index and every block of the
    /// sample data, at the ETag it recorded (the newest such directory when several versions
    /// are cached). No request is made.
    ///
    /// Errors: no cache of the URL, or none complete and clean (each candidate's reason
    /// given), or its index fails its checks.
    pub fn open_offline(url: &str, args: &RemoteConfig) -> Result<RemotePack> {
        let root = args.cache_dir.clone().unwrap_or_else(cache::default_root);
        cache::check_root(&root)
            .with_context(|| format!("cannot use the cache root {}", root.display()))?;
        let prefix = cache::url_prefix(url);
        let mut dirs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&root)
            .with_context(|| format!("cannot list the cache root {}", root.display()))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| {
                let t = e.metadata().and_then(|m| m.modified());
                (t.unwrap_or(std::time::UNIX_EPOCH), e.path())
            })
            .collect();
        dirs.sort_by(|a, b| b.cmp(a));
        let mut why = Vec::new();
        for (_, dir) in dirs {
            match offline_candidate(url, &dir) {
                Ok((cache_dir, pin, map, totals)) => {
                    // Room for every block: nothing cached may be evicted.
                    let limit = pin.size.div_ceil(cache::BLOCK) * cache::BLOCK;
                    let source = Arc::new(OfflineObject::new(url, pin)?);
                    let storage =
                        BlockCache::open(source, cache_dir, limit).with_context(|| {
                            format!("cannot open the block cache {}", dir.display())
                        })?;
                    log::info!("{url}: mounted --offline from {}", dir.display());
                    return Ok(RemotePack {
                        url: url.to_string(),
                        storage: Arc::new(storage),
                        index: Arc::new(map),
                        totals,
                        dir,
                        open_requests: 0,
                    });
                }
                Err(e) => why.push(format!("{}: {e:#}", dir.display())),
            }
        }
        if why.is_empty() {
            bail!(
                "{url}: --offline, but the cache root {} holds no block cache of it (mount it online first)",
                root.display()
            );
        }
        bail!(
            "{url}: --offline needs a complete block cache closed cleanly (`loosefs warm MNT --wait` while online, then unmount); none is:\n  {}",
            why.join("\n  ")
        )
    }

    /// Waits until a fetched index is kept in the cache directory (before a short-lived
    /// command exits).
    pub fn finish(&mut self) {
        self.storage.join_writers();
    }

    /// The URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Size of the object, bytes.
    pub fn size(&self) -> u64 {
        self.storage.source().pin().map_or(0, |p| p.size)
    }

    /// The index.
    pub fn index(&self) -> IndexView<'_> {
        IndexView::from_validated(&self.index, self.totals).expect("checked at open")
    }

    /// Totals of the index.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The object's block cache.
    pub fn storage(&self) -> &Arc<BlockCache> {
        &self.storage
    }

    /// The cache directory of this object (at this ETag).
    pub fn cache_dir(&self) -> &Path {
        &self.dir
    }

    /// The catalog of the pack, showing decoded `views`.
    pub fn catalog(&self, views: Views) -> Result<NativeCatalog> {
        NativeCatalog::with_objects(
            self.index.clone(),
            0..self.index.len(),
            vec![ObjectInfo {
                path: PathBuf::from(&self.url),
                len: self.size(),
                data_end: self.totals.data_end,
                align: u64::from(self.totals.align),
            }],
            vec![0],
            views,
        )
        .map_err(|e| anyhow!("{}: {e}", self.url))
    }

    /// Downloads every block not yet cached (concurrent GETs) and returns the cache file,
    /// which is then the whole pack. Errors: the cache is smaller than the pack, or a GET
    /// fails.
    pub fn download(&self) -> Result<PathBuf> {
        use crate::storage::Storage;
        let size = self.size();
        if self.storage.limit() < size {
            bail!(
                "{}: the block cache holds {} bytes, less than the pack's {size} (--cache-size)",
                self.url,
                self.storage.limit()
            );
        }
        self.storage.will_need(0, &(0..size));
        let mut buf = vec![0u8; cache::MERGE as usize];
        let mut off = 0;
        while off < size {
            let n = (size - off).min(cache::MERGE);
            self.storage
                .read_at(0, off, &mut buf[..n as usize])
                .with_context(|| format!("{}: download failed", self.url))?;
            off += n;
        }
        Ok(self.dir.join("data"))
    }
}

/// The cache directory `dir` locked, with the pin, index and totals it recorded for `url`,
/// if it was closed cleanly and holds the index and every block of the sample data.
fn offline_candidate(url: &str, dir: &Path) -> Result<(CacheDir, Pin, Mmap, Totals)> {
    let cache_dir = CacheDir::lock(dir).context("cannot lock it (mounted now?)")?;
    let mut meta = Vec::new();
    std::io::Read::read_to_end(&mut cache_dir.open_ro("object.json")?, &mut meta)
        .context("no object.json")?;
    let meta: serde_json::Value = serde_json::from_slice(&meta).context("damaged object.json")?;
    if meta["url"].as_str() != Some(url) {
        bail!("the cache of another URL ({})", meta["url"]);
    }
    let pin = Pin {
        size: meta["size"].as_u64().context("object.json: no size")?,
        etag: meta["etag"].as_str().unwrap_or_default().to_string(),
        version: meta["version"].as_str().map(str::to_string),
        modified: None,
    };
    if meta["block"].as_u64() != Some(cache::BLOCK) {
        bail!("blocks of another size");
    }
    let len = cache_dir
        .open_ro("index")
        .and_then(|f| f.metadata())
        .context("no kept index")?
        .len();
    let (map, totals) = kept_index(&cache_dir, len).context("the kept index is damaged")?;
    IndexView::from_validated(&map, totals)
        .context("damaged index (bounds)")?
        .validate_tree()
        .context("damaged index")?;
    if totals.data_end > pin.size {
        bail!("its index runs past the object's {} bytes", pin.size);
    }
    if !cache::complete_on_disk(&cache_dir, pin.size, &(0..totals.data_end))? {
        bail!("not complete or not closed cleanly");
    }
    Ok((cache_dir, pin, map, totals))
}

/// The index kept in the cache directory by an earlier open, when it has the expected length
/// `len` and passes its checksum (a kept index that fails is fetched again).
fn kept_index(dir: &CacheDir, len: u64) -> Option<(Mmap, Totals)> {
    let f = dir.open_ro("index").ok()?;
    // SAFETY: a read-only map of a file this program wrote whole and renamed into place; it
    // is checked below before use.
    let m = unsafe { Mmap::map(&f) }.ok()?;
    if m.len() as u64 != len {
        return None;
    }
    let totals = IndexView::parse(&m).ok()?.totals();
    Some((m, totals))
}

/// Keeps a fetched index in `dir` for the next mount, off the critical path (temp + rename,
/// so a crash leaves no partial index under the name).
fn keep_index(index: Arc<Mmap>, dir: PathBuf) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let write = || -> std::io::Result<()> {
            let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
            tmp.write_all(&index)?;
            tmp.persist(dir.join("index"))?;
            Ok(())
        };
        if let Err(e) = write() {
            log::warn!("cannot keep the index in {}: {e}", dir.display());
        }
    })
}

/// GETs `r` in [`INDEX_PART`] parts concurrently into `out` (`r`'s length).
fn fetch_parts(client: &dyn ObjectSource, r: std::ops::Range<u64>, out: &mut [u8]) -> Result<()> {
    let mut parts = Vec::new();
    let mut off = r.start;
    while off < r.end {
        let end = (off + INDEX_PART).min(r.end);
        parts.push(off..end);
        off = end;
    }
    let got = client.runtime().block_on(futures::future::join_all(
        parts.iter().map(|p| client.get(p.clone())),
    ));
    for (p, g) in parts.iter().zip(got) {
        let g = g.with_context(|| format!("{}: cannot fetch the index", client.url()))?;
        let at = (p.start - r.start) as usize;
        out[at..at + g.len()].copy_from_slice(&g);
    }
    Ok(())
}
