//! Opens a foreign dataset (MDS, LitData, WebDataset/tar, TFRecord, Parquet, FFCV, zip) at an
//! `s3://` or `https://` URL. Its objects are found by an S3 prefix listing
//! (`s3://bucket/prefix/`), a brace pattern of shard URLs (`https://host/d/shard-{0..9}.tar`,
//! as WebDataset names them), the `index.json` of an MDS or LitData directory over HTTPS
//! (`https://host/d/`: HTTP has no listing), or one URL (a zip, a `.beton`, a Parquet file).
//! Each object is pinned to its ETag: the one its S3 listing gave, else by a 1-byte GET (all
//! concurrently); each is served through its own block cache ([`ObjectSet`]).
//!
//! The index is kept in the index directory under a key made of the URL, every object's name,
//! ETag and size, and the scan options, so a remount of an unchanged dataset reads no sample:
//! on S3 it makes one request (the LIST), elsewhere one GET per object. Building it reads one zip or FFCV object's tables alone
//! (`remote_dataset/build.rs`), else downloads every object into its block cache (the
//! first epoch is then served from the cache), and scans the cached copies with the same
//! parsers as a local dataset, so the tree is the local mount's, byte for byte.
//! Compressed chunks (zstd MDS, LitData, deflated zip, Parquet) are decompressed from the
//! shards' block caches; a `.tar.gz` is refused (it is inflated into a local file).
//! A shared index ([`shared`]) spares the download and scan on every other node; `--offline`
//! (`remote_dataset/offline.rs`) serves a dataset from its whole block caches without the server.

use super::discover::Probe;
use super::url::{Shape, SourceUrl};
use crate::catalog::native::NativeCatalog;
use crate::formats::index::{self, Foreign, Header, ObjectEntry, RemoteEntry};
use crate::open::OpenOptions;
use crate::storage::block_cache as cache;
use crate::storage::chunks::{MixedStorage, Part};
use crate::storage::object::set::ObjectSet;
use crate::storage::object::source::{Listed, ObjectSource, ObjectStore, Pin};
use crate::view::Views;
use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod build;
mod offline;
use super::caches::LockedCaches;
pub mod shared;
use build::build;

/// Bytes of an MDS or LitData `index.json` read over HTTPS at most (an MDS index of 1M
/// samples in 64 MiB shards is about 1 MiB).
const INDEX_JSON_MAX: u64 = 64 << 20;

/// An opened remote dataset.
#[derive(Debug)]
pub struct RemoteDataset {
    url: String,
    /// The index (objects named by their path below the `.view-KEY` directory they were
    /// scanned in).
    pub foreign: Foreign,
    /// The block caches of the objects the samples come from, once each.
    files: Vec<Arc<cache::BlockCache>>,
    /// Per object of the index: its file among `files`.
    file_of: Vec<u32>,
    root: PathBuf,
    /// Every object of the dataset with its pin, in the order found.
    pub objects: Vec<RemoteEntry>,
    /// Where its objects are (a shared index is uploaded through it too).
    store: Arc<dyn ObjectStore>,
    /// GETs made to open it: one per object, and the downloads when the index was built
    /// (the S3 listing or the `index.json` read that found the objects not counted).
    pub open_requests: u64,
    /// Bytes received to open it.
    pub open_bytes: u64,
}

/// The objects of a dataset: where their names start (`dir`, ending with `/`), the names in
/// order, and what an S3 listing said of each (size and ETag: no GET needed to pin them).
type Names = (String, Vec<String>, Vec<Option<Pin>>);

/// Where the names of `url`'s objects start: the prefix itself, else up to the last `/`
/// before the brace pattern or the object's name.
fn dir_of(url: &str) -> &str {
    let head = if url.ends_with('/') {
        return url;
    } else {
        &url[..url.find('{').unwrap_or(url.len())]
    };
    &url[..head.rfind('/').map_or(0, |p| p + 1)]
}

/// Whether `name` (an object's name relative to its dataset, from a listing, an `index.json`
/// or a shared index) stays inside the dataset and its cache directory: not empty, no leading
/// `/`, no empty, `.` or `..` segment, no NUL or backslash. Checked by loosefs itself before
/// any name reaches a URL or a path, whatever the object client's own parser accepts.
pub(crate) fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(['\0', '\\'])
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Refuses the first unsafe name of `names` (see [`safe_name`]), naming where it came from.
fn check_safe(names: &[String], from: &str) -> Result<()> {
    match names.iter().find(|n| !safe_name(n)) {
        Some(n) => bail!(
            "{from} names the object {n:?}, which would lie outside the dataset (an empty, \
             absolute, `.` or `..` path): refused"
        ),
        None => Ok(()),
    }
}

/// The objects `src` names (see [`Names`]), and for a listed prefix what its listing says of
/// the default shared index (`.loosefs-index` at the top of the prefix), if there is one:
/// a pattern's expanded, one object's name, a prefix's `listed` (as discovery listed it), else
/// (an HTTP directory its server does not list) those its `index.json` names.
fn object_names(
    src: &SourceUrl,
    listed: Option<Vec<Listed>>,
    store: &dyn ObjectStore,
) -> Result<(Names, Option<Pin>)> {
    let url = src.url.as_str();
    let dir = dir_of(url).to_string();
    if src.shape == Shape::Pattern {
        let urls = crate::formats::expand_braces(url);
        let names: Vec<String> = urls.iter().map(|u| u[dir.len()..].to_string()).collect();
        check_safe(&names, url)?;
        let pins = vec![None; names.len()];
        return Ok(((dir, names, pins), None));
    }
    if src.shape == Shape::Object {
        let name = url[dir.len()..].to_string();
        return Ok(((dir, vec![name], vec![None]), None));
    }
    // A bucket prefix not listed by discovery (`--format` given) is listed here.
    let listed = match listed {
        None if src.is_bucket_prefix() => Some(store.list(url)?),
        l => l,
    };
    if let Some(listed) = listed {
        let index_pin = (listed.iter())
            .find(|l| l.key == index::shared::SUFFIX)
            .and_then(|l| l.pin.clone());
        let (names, pins): (Vec<String>, Vec<Option<Pin>>) = listed
            .into_iter()
            // An HTTP server's listing gives no ETag: each object is pinned by its first GET.
            .map(|l| (l.key, l.pin.filter(|p| !p.etag.is_empty())))
            .filter(|(k, _)| {
                !k.split('/').any(|c| c.starts_with('.')) && !k.ends_with(index::shared::SUFFIX)
            })
            .unzip();
        if names.is_empty() {
            bail!("{url}: no objects under this prefix");
        }
        check_safe(&names, &format!("the listing of {url}"))?;
        return Ok(((dir, names, pins), index_pin));
    }
    let index_url = format!("{url}index.json");
    let c = store.object(&index_url)?;
    let bytes = c.open_tail_blocking(INDEX_JSON_MAX).with_context(|| {
        format!("{url}: as a packed dataset, an HTTP directory needs an index.json (MDS, LitData), or give the shards as a brace pattern (https://host/dir/shard-{{000000..000099}}.tar)")
    })?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{index_url}: not JSON"))?;
    let mut names = vec!["index.json".to_string()];
    let name = |x: &serde_json::Value| x.as_str().map(str::to_string);
    for s in v["shards"].as_array().into_iter().flatten() {
        // MDS: the compressed file when there is one, else the raw one.
        let f = &s["zip_data"]["basename"];
        names.extend(name(f).or_else(|| name(&s["raw_data"]["basename"])));
    }
    for c in v["chunks"].as_array().into_iter().flatten() {
        names.extend(name(&c["filename"]));
    }
    if names.len() == 1 {
        bail!("{index_url}: names no MDS shards nor LitData chunks");
    }
    check_safe(&names, &index_url)?;
    let pins = vec![None; names.len()];
    Ok(((dir, names, pins), None))
}

/// The dataset's objects and its shared index if one is used (`probe`: what discovery found
/// asking for it): unlisted datasets look for it first (its names and pins replace the
/// `index.json` read and the GET per object); a listed bucket prefix finds it in its listing.
fn locate(
    src: &SourceUrl,
    (listed, probe): (Option<Vec<Listed>>, Probe),
    args: &OpenOptions,
    store: &dyn ObjectStore,
    use_shared: bool,
    index_dir: &Path,
) -> Result<(Names, Option<shared::Found>)> {
    let (url, listed_prefix) = (src.url.as_str(), src.is_bucket_prefix());
    if use_shared && !listed_prefix {
        if let Some(mut f) = shared::find(url, dir_of(url), args, store, (None, probe), index_dir)?
        {
            return Ok((std::mem::take(&mut f.names), Some(f)));
        }
    }
    let ((dir, names, pins), listed_index) = object_names(src, listed, store)?;
    let mut found = None;
    if use_shared && listed_prefix {
        let listed = (names.as_slice(), pins.as_slice(), listed_index.as_ref());
        found = shared::find(
            url,
            &dir,
            args,
            store,
            (Some(listed), Probe::NotAsked),
            index_dir,
        )?;
    }
    Ok(((dir, names, pins), found))
}

/// The shared index `found` as the dataset's kept index: one fetched is linked at `kept` (a
/// remount of a listed prefix finds it there without fetching it again); a local file named by
/// `--index` is used where it is.
fn keep(found: shared::Found, kept: &Path) -> Foreign {
    let mut f = found.foreign;
    if found.fetched > 0 && (std::fs::hard_link(&f.path, kept).is_ok() || kept.is_file()) {
        let _ = std::fs::remove_file(&f.path);
        f.path = kept.to_path_buf();
    }
    f
}

/// Opens every object of `names` under `dir`: pinned to what the listing said of it
/// (`pins`), else by a 1-byte GET (which gives its size and ETag), concurrently (at most
/// `--max-requests` GETs at once).
fn open_objects(
    dir: &str,
    names: &[String],
    pins: Vec<Option<Pin>>,
    args: &OpenOptions,
    store: &dyn ObjectStore,
) -> Result<Vec<Arc<dyn ObjectSource>>> {
    let mut clients = Vec::with_capacity(names.len());
    for n in names {
        clients.push(store.object(&crate::storage::object::url_below(dir, n))?);
    }
    for (c, p) in clients.iter().zip(pins) {
        if let Some(p) = p {
            c.set_pin(p);
        }
    }
    let rt = clients[0].runtime();
    let max = args.remote.max_requests.max(1);
    let opened: Vec<Result<()>> = rt.block_on(
        futures::stream::iter(
            clients
                .iter()
                .filter(|c| c.pin().is_none())
                .map(|c| async move { c.open_tail(1).await.map(|_| ()) }),
        )
        .buffered(max)
        .collect(),
    );
    for r in opened {
        r?;
    }
    Ok(clients)
}

/// The URL and what the scan is asked to show: the part of a kept index's key (and the whole
/// key of the `--offline` record) that needs no request.
fn options_key(url: &str, args: &OpenOptions) -> String {
    // The command line's spellings of --fields and --verify (kept indexes stay valid).
    format!(
        "{url}\u{0}{:?}\u{0}{:?}\u{0}{}\u{0}{:?}\u{0}{}",
        args.format,
        args.label,
        if args.fields_all { "all" } else { "image" },
        args.class_names,
        if args.verify_full { "full" } else { "lazy" }
    )
}

/// The pin a shared index or `--offline` record gives an object.
fn pin_of(e: &RemoteEntry) -> Pin {
    Pin {
        size: e.size,
        etag: e.etag.clone(),
        version: e.version.clone(),
        modified: None,
    }
}

/// The kept index's key: the URL, every object's name, ETag, version and size, and what the
/// scan is asked to show.
fn key_of(url: &str, names: &[String], pins: &[Pin], args: &OpenOptions) -> u64 {
    let mut k = options_key(url, args);
    for (n, p) in names.iter().zip(pins) {
        k.push_str(&format!(
            "\u{0}{n}\u{1}{}\u{1}{:?}\u{1}{}",
            p.etag, p.version, p.size
        ));
    }
    xxhash_rust::xxh3::xxh3_64(k.as_bytes())
}

/// Whether the kept index `f` serves a mount with `args`: one built from the tables alone has
/// no JPEG dimensions, which decoded views need (such a mount builds it again, reading every
/// sample's head).
fn fits(f: &Foreign, args: &OpenOptions) -> Result<bool> {
    let opts = args.scan_options()?;
    Ok(index::verify_accepted(&opts)
        .iter()
        .any(|v| f.header.options.ends_with(&format!("verify={v}"))))
}

/// The block caches the index `f`'s objects read, once each (`cache(i)`: that of `names[i]`),
/// and per object of the index its cache among them. Errors: the index names an object the
/// dataset does not hold, or `cache` fails (its message).
fn files_of(
    f: &Foreign,
    names: &[String],
    mut cache: impl FnMut(usize) -> Result<Arc<cache::BlockCache>>,
) -> Result<(Vec<Arc<cache::BlockCache>>, Vec<u32>)> {
    let (mut files, mut file_of) = (Vec::new(), Vec::with_capacity(f.header.objects.len()));
    let mut seen = std::collections::HashMap::new();
    for o in &f.header.objects {
        let i = object_name(&f.header, o)
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

impl RemoteDataset {
    /// Opens the dataset at `src` (see the module note) from what discovery learnt of it
    /// ([`super::discover`]): its prefix's `listed` objects (`None`: not listed), and
    /// `shared_index`, what asking for its default shared index found; `progress` says on
    /// stderr what is done when the index is built.
    ///
    /// Errors: no objects found (the message says what to give), an object cannot be opened
    /// (404, 403, network: the server's reason), the cache cannot hold every object while the
    /// index is built, the dataset is damaged or compressed (the local parser's message).
    /// A shared index ([`shared`]) is used when there is one whose options fit: nothing is
    /// downloaded or scanned then.
    pub(crate) fn open(
        src: &SourceUrl,
        listed: Option<Vec<Listed>>,
        shared_index: Probe,
        args: &OpenOptions,
        progress: crate::progress::Progress,
        store: Arc<dyn ObjectStore>,
    ) -> Result<RemoteDataset> {
        Self::open_with(src, (listed, shared_index), args, progress, true, store)
    }

    /// [`RemoteDataset::open`] without looking for a shared index (what `loosefs index` does:
    /// it indexes the dataset as it is now).
    pub(crate) fn open_unshared(
        src: &SourceUrl,
        listed: Option<Vec<Listed>>,
        args: &OpenOptions,
        progress: crate::progress::Progress,
        store: Arc<dyn ObjectStore>,
    ) -> Result<RemoteDataset> {
        Self::open_with(src, (listed, Probe::NotAsked), args, progress, false, store)
    }

    fn open_with(
        src: &SourceUrl,
        lead: (Option<Vec<Listed>>, Probe),
        args: &OpenOptions,
        progress: crate::progress::Progress,
        use_shared: bool,
        store: Arc<dyn ObjectStore>,
    ) -> Result<RemoteDataset> {
        let url = src.url.as_str();
        if args.remote.offline {
            // Whatever keeps the caches from serving it, the source is not available offline.
            return offline::open(url, args, store).map_err(|e| {
                crate::exit_code::with_kind(e, crate::exit_code::ExitKind::Unavailable)
            });
        }
        let index_dir = index::cache_dir(args.index_dir.as_deref());
        let ((dir, names, pins), found) = locate(src, lead, args, &*store, use_shared, &index_dir)?;
        let clients = open_objects(&dir, &names, pins, args, &*store)?;
        let pins = (clients.iter())
            .map(|c| {
                c.pin()
                    .cloned()
                    .ok_or_else(|| anyhow!("{}: not pinned by its open", c.url()))
            })
            .collect::<Result<Vec<Pin>>>()?;
        let key = key_of(url, &names, &pins, args);
        let root = args
            .remote
            .cache_dir
            .clone()
            .unwrap_or_else(cache::default_root);
        cache::check_root(&root)
            .with_context(|| format!("cannot use the cache root {}", root.display()))?;
        let caches = LockedCaches::lock(&root, clients.clone())?.open(args.remote.cache_size)?;
        let view = root.join(format!(".view-{key:016x}"));
        let kept = index_dir.join(format!("remote-{key:016x}.lfx"));
        let (mut shared_gets, mut shared_bytes) = (0, 0);
        let foreign = match (found, index::load(&kept)) {
            (Some(found), _) => {
                (shared_gets, shared_bytes) = (u64::from(found.fetched > 0), found.fetched);
                keep(found, &kept)
            }
            (None, Ok(f)) if f.header.objects.len() <= names.len() && fits(&f, args)? => f,
            _ => {
                // One object (a zip, a `.beton`) is scanned as a file, several as a directory.
                let src = match names.as_slice() {
                    [one] if !src.names_many() => view.join(one),
                    _ => view.clone(),
                };
                build(url, &names, &caches, (&view, &src), &kept, args, progress)?
            }
        };
        if foreign
            .header
            .objects
            .iter()
            .any(|o| o.derived_from.is_some())
        {
            bail!(
                "{url}: a .tar.gz is inflated into a local file; it is not served from a URL: mount a local copy"
            );
        }
        let (files, file_of) = files_of(&foreign, &names, |i| Ok(caches[i].clone()))
            .map_err(|e| anyhow!("{}: {e}", kept.display()))?;
        let (open_requests, open_bytes) =
            clients
                .iter()
                .fold((shared_gets, shared_bytes), |(g, b), c| {
                    (
                        g + c.stats().gets.load(std::sync::atomic::Ordering::Relaxed),
                        b + c.stats().bytes.load(std::sync::atomic::Ordering::Relaxed),
                    )
                });
        let objects = (names.iter().zip(&pins))
            .map(|(n, p)| RemoteEntry {
                name: n.clone(),
                size: p.size,
                etag: p.etag.clone(),
                version: p.version.clone(),
            })
            .collect();
        let ds = RemoteDataset {
            url: url.to_string(),
            objects,
            store,
            foreign,
            files,
            file_of,
            root,
            open_requests,
            open_bytes,
        };
        offline::record(&ds, &dir, args, &index_dir);
        Ok(ds)
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cache root holding the objects' block caches.
    pub fn cache_root(&self) -> &Path {
        &self.root
    }

    /// Bytes of every object the samples are read from.
    pub fn size(&self) -> u64 {
        self.foreign.header.objects.iter().map(|o| o.len).sum()
    }

    /// The storage: the block cache of each object; compressed chunks (zstd MDS shards,
    /// LitData chunks, deflated zip members, compressed Parquet row groups) decompressed from
    /// those into a cache of at most `chunk_cache` bytes.
    pub fn storage(&self, chunk_cache: u64) -> Arc<dyn crate::storage::Storage> {
        let root = self.root.display().to_string();
        let objects = &self.foreign.header.objects;
        if objects.iter().all(|o| o.chunk.is_none()) {
            let order = self.file_of.iter().map(|&i| self.files[i as usize].clone());
            return Arc::new(ObjectSet::new(&self.url, &root, order.collect()));
        }
        let set = Arc::new(ObjectSet::new(&self.url, &root, self.files.clone()));
        let parts = (objects.iter().zip(&self.file_of))
            .map(|(o, &i)| match &o.chunk {
                Some(spec) => Part::Chunk(spec.with_stored(&o.path, set.clone(), i)),
                None => Part::Plain(i),
            })
            .collect();
        MixedStorage::with_plain(set, parts, chunk_cache)
    }

    /// What `info` prints: the index's summary, with the URL as the source.
    pub fn info(&self) -> index::ForeignInfo {
        let mut i = self.foreign.info();
        i.source = self.url.clone();
        i.index = self.foreign.path.display().to_string();
        i
    }

    /// What opening cost and where the cache is, for `info`: text lines.
    pub fn open_text(&self) -> String {
        format!(
            "requests:      {} GET(s), {} bytes received to open\ncache:         {}\n",
            self.open_requests,
            self.open_bytes,
            self.root.display()
        )
    }

    /// The catalog of the dataset's tree. Errors: the index is damaged.
    pub fn catalog(&self, views: Views) -> Result<NativeCatalog> {
        let f = &self.foreign;
        NativeCatalog::with_objects(
            f.map.clone(),
            f.index.clone(),
            f.objects(),
            f.header.bases.clone(),
            views,
        )
        .map_err(|e| anyhow!("{}: {e}", self.url))
    }
}

/// The dataset object an index entry names: its path itself in a shared index (relative to
/// the dataset's URL), else its path below the `.view-KEY` directory it was scanned in.
fn object_name(h: &Header, o: &ObjectEntry) -> Option<String> {
    if h.relative {
        o.path
            .to_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    } else {
        name_in_view(&o.path)
    }
}

/// The object's name as the index recorded it: its path below the `.view-KEY` directory it
/// was scanned in (whatever cache root that was in).
fn name_in_view(p: &Path) -> Option<String> {
    let mut parts = p
        .iter()
        .skip_while(|c| !c.to_string_lossy().starts_with(".view-"));
    parts.next()?;
    let rel: PathBuf = parts.collect();
    rel.to_str().filter(|s| !s.is_empty()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(url: &str) -> SourceUrl {
        SourceUrl::parse(url).expect("a URL")
    }

    #[test]
    fn names_that_would_leave_the_dataset_are_refused() {
        for ok in ["a.tar", "train/part-0.tar", "x..y/z.mds", ".hidden"] {
            assert!(safe_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "a/./b",
            "a/",
            ".",
            "..",
            "a\0b",
            "..\\x",
        ] {
            assert!(!safe_name(bad), "{bad:?}");
        }
        let store = crate::storage::object::fake::FakeStore::new();
        let e = object_names(&src("https://h/d/{../x,y}.tar"), None, &*store).unwrap_err();
        assert!(format!("{e:#}").contains("outside the dataset"), "{e:#}");
    }

    #[test]
    fn brace_patterns_and_single_urls_name_their_objects_without_a_request() {
        let args = crate::storage::object::fake::FakeStore::new();
        let args = &*args;
        let ((dir, names, _), _) =
            object_names(&src("https://h/d/shard-{000..002}.tar"), None, args).unwrap();
        assert_eq!(dir, "https://h/d/");
        assert_eq!(names, ["shard-000.tar", "shard-001.tar", "shard-002.tar"]);
        let ((dir, names, _), _) =
            object_names(&src("s3://b/x/{train,val}/part-{0..1}.tar"), None, args).unwrap();
        assert_eq!(dir, "s3://b/x/");
        assert_eq!(
            names,
            [
                "train/part-0.tar",
                "train/part-1.tar",
                "val/part-0.tar",
                "val/part-1.tar"
            ]
        );
        let ((dir, names, pins), _) =
            object_names(&src("s3://b/ffcv/jpg.beton"), None, args).unwrap();
        assert_eq!(pins, [None]);
        assert_eq!(
            (dir.as_str(), names),
            ("s3://b/ffcv/", vec!["jpg.beton".to_string()])
        );
        assert!(src("s3://b/mds/").names_many() && src("https://h/{0..1}.tar").names_many());
        assert_eq!(dir_of("s3://b/d/x/{0..1}.tar"), "s3://b/d/x/");
        assert!(
            src("S3://b/d/").is_bucket_prefix()
                && src("gs://b/d/").is_bucket_prefix()
                && !src("https://h/d/").is_bucket_prefix()
        );
        assert!(!src("https://h/a.zip").names_many());
    }

    #[test]
    fn names_are_read_below_the_view_whatever_cache_root_it_was_in() {
        let p = Path::new("/a/cache1/.view-00ff/sub/shard.00000.mds");
        assert_eq!(name_in_view(p).as_deref(), Some("sub/shard.00000.mds"));
        assert_eq!(
            name_in_view(Path::new("/x/.view-1/a.tar")).as_deref(),
            Some("a.tar")
        );
        assert_eq!(name_in_view(Path::new("/x/.view-1")), None);
        assert_eq!(name_in_view(Path::new("/x/y/a.tar")), None);
    }
}
