//! A source given as a URL: what it names, understood once from the URL itself
//! ([`SourceUrl`]: the store, from [`crate::storage::object::is_url`]; the shape, from its
//! path), then opened by one documented sequence of probes. Every later step takes the
//! [`SourceUrl`], never the string's prefixes or an error's text.
//!
//! The sequence (`--format` given: a foreign dataset of that format, at once):
//! 1. **A prefix** (`…/`) of a bucket store: its first level listed (1 LIST); a shared listing
//!    `.loosefs-index` found there is taken (checked against that level, 1 GET); else the
//!    prefix listed whole: loose files, or a packed format's shards when the names say so
//!    (`holds_a_format`), handed to the dataset opener with that listing.
//! 2. **A directory** (`…/`) of an HTTP server: `.loosefs-index` asked for first (a listing
//!    hides dot names): a shared listing, or a foreign dataset's shared index; else the
//!    server's listing as in 1; else the dataset opener (`index.json`).
//! 3. **A brace pattern** (`…/{0..9}.tar`): the dataset opener.
//! 4. **One object**: a native pack (a suffix GET of its trailer); not a pack: one object in
//!    another format (zip, `.beton`, Parquet, tar).
//!
//! `--offline`: nothing is requested; a prefix goes to the dataset opener (a recorded dataset).
//! `loosefs index URL` follows 1–2 to write the shared listing or index ([`index_url`]).

use super::remote_dataset::{self, RemoteDataset};
use super::remote_dir::{self, RemoteDir};
use super::remote_pack::RemotePack;
use super::{Dataset, OpenError, OpenOptions, probed};
use crate::storage::object::source::ObjectStore;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Arc;

/// What a source URL names, decided from the URL alone (no request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Ends with `/`: a prefix of a bucket store (`bucket`: listed page by page), or a
    /// directory of an HTTP server.
    Prefix { bucket: bool },
    /// A brace pattern naming several objects (`…/part-{0..9}.tar`).
    Pattern,
    /// One object: a pack, or one object in another format.
    Object,
}

/// A source URL, understood once.
#[derive(Debug, Clone)]
pub(crate) struct SourceUrl {
    /// The URL as given.
    pub url: String,
    pub shape: Shape,
}

impl SourceUrl {
    /// `src` as a source URL; `None` when no store reads it (a local path).
    pub(crate) fn parse(src: &str) -> Option<SourceUrl> {
        if !crate::storage::object::is_url(src) {
            return None;
        }
        let shape = if remote_dataset::is_prefix(src) {
            Shape::Prefix {
                bucket: remote_dataset::is_bucket_prefix(src),
            }
        } else if remote_dataset::names_many(src) {
            Shape::Pattern
        } else {
            Shape::Object
        };
        Some(SourceUrl {
            url: src.to_string(),
            shape,
        })
    }
}

/// For a missing object `url` of a bucket store that names a prefix without its trailing `/`:
/// what to give instead (one LIST of `url/`, made only after the 404). Else nothing.
fn prefix_hint(url: &str, store: &dyn ObjectStore) -> String {
    let prefix = format!("{url}/");
    if !crate::storage::object::is_bucket_url(url) {
        return String::new();
    }
    match store.list_level(&prefix) {
        Ok(l) if !l.objects.is_empty() || !l.dirs.is_empty() => {
            format!(" (it is a prefix of objects: give {prefix}, with its trailing `/`)")
        }
        _ => String::new(),
    }
}

/// Opens the dataset `src` names, by the sequence in this module's documentation.
///
/// Errors: each way tried failed; the message names each and why.
pub(super) fn open(
    src: &SourceUrl,
    opts: &OpenOptions,
    progress: crate::progress::Progress,
    store: Arc<dyn ObjectStore>,
) -> Result<Dataset> {
    let url = src.url.as_str();
    let dataset = |store| open_remote_set(url, opts, progress, store);
    // A prefix of loose objects (not a packed format) in a bucket, or a directory an HTTP
    // server lists, is served as files from its listing alone.
    if let (Shape::Prefix { bucket }, None, false) = (src.shape, &opts.format, opts.remote.offline)
    {
        let cannot = || format!("cannot open {url}");
        if !bucket && opts.shared_index.is_none() {
            return open_http_dir(url, opts, progress, store);
        }
        // An HTTP directory may have no listing: a named shared listing may describe it.
        let (level, unlisted) = match store.list_level(url) {
            Ok(l) => (Some(l), None),
            Err(e) if !bucket => (None, Some(e)),
            Err(e) => return Err(e.context(cannot())),
        };
        match remote_dir::shared_listing::find(url, level.as_ref(), opts, &*store) {
            Ok(Some((listed, at))) => {
                let mut r = RemoteDir::open(url, listed, opts, &*store).with_context(cannot)?;
                r.shared = Some(at);
                return Ok(Dataset::RemoteDir(Box::new(r)));
            }
            Ok(None) => {}
            Err(e) => match (e.downcast_ref::<remote_dir::shared_listing::Stale>(), level) {
                (Some(stale), Some(level)) if opts.refresh_index => {
                    let at = stale.at.clone();
                    return refresh(url, &at, level, opts, progress, store);
                }
                (Some(_), _) => {
                    let e = crate::exit_code::with_kind(e, crate::exit_code::ExitKind::Changed);
                    return Err(e.context(cannot()));
                }
                _ => return Err(e.context(cannot())),
            },
        }
        let Some(level) = level else {
            let unlisted = unlisted.map(|e| format!("{e:#}")).unwrap_or_default();
            return open_remote_set(url, opts, progress, store).map_err(|d| {
                crate::exit_code::joined(d, format!("\n  as loose files: {unlisted}"))
            });
        };
        return open_listed(url, level, opts, progress, store);
    }
    if opts.format.is_some() || src.shape != Shape::Object {
        return dataset(store);
    }
    match RemotePack::open(url, &*store, &opts.remote) {
        Ok(r) => Ok(Dataset::Remote(r)),
        Err(e @ OpenError::NotAPack { .. }) => dataset(store)
            .map_err(|d| crate::exit_code::joined(d, format!("\n  loosefs pack: {e:#}"))),
        Err(e) if opts.remote.offline => dataset(store)
            .map_err(|d| crate::exit_code::joined(d, format!("\n  loosefs pack: {e:#}"))),
        Err(OpenError::Other(e))
            if crate::storage::object::error_kind(&e) == Some(std::io::ErrorKind::NotFound) =>
        {
            Err(e.context(format!("cannot open {url}{}", prefix_hint(url, &*store))))
        }
        // The error itself, not a transparent wrapper that would hide its type (and so its
        // exit code, `crate::exit_code`).
        Err(OpenError::Other(e)) => Err(e.context(format!("cannot open {url}"))),
    }
}

/// `--refresh` of the prefix `url` (first level `level`) whose shared listing `at` is
/// stale: the prefix listed again, the new listing written over `at` (a warning if it
/// cannot be: the mount goes on from the fresh listing), then served as loose files.
fn refresh(
    url: &str,
    at: &str,
    level: crate::storage::object::source::Level,
    opts: &OpenOptions,
    progress: crate::progress::Progress,
    store: Arc<dyn ObjectStore>,
) -> Result<Dataset> {
    let cannot = || format!("cannot open {url}");
    crate::eprintln_lossy!("loosefs: {at} is stale: --refresh lists {url} again");
    let listed = store
        .list_below(url, level, progress)
        .with_context(cannot)?;
    match remote_dir::shared_listing::write(url, &listed, Some(Path::new(at)), &*store) {
        Ok(line) => crate::eprintln_lossy!("loosefs: {line}"),
        Err(e) => {
            log::warn!("--refresh: the shared index {at} was not rewritten: {e:#}");
            crate::eprintln_lossy!(
                "loosefs: --refresh: the shared index {at} was not rewritten: {e:#}"
            );
        }
    }
    RemoteDir::open(url, listed, opts, &*store)
        .with_context(cannot)
        .map(|r| Dataset::RemoteDir(Box::new(r)))
}

/// A foreign dataset at `url`, through `store`.
fn open_remote_set(
    url: &str,
    opts: &OpenOptions,
    progress: crate::progress::Progress,
    store: Arc<dyn ObjectStore>,
) -> Result<Dataset> {
    RemoteDataset::open(url, opts, progress, store)
        .with_context(|| format!("cannot open {url}"))
        .map(|r| Dataset::RemoteSet(Box::new(r)))
}

/// The prefix `url` whose first level is `level`: listed whole, then loose files, or a
/// packed format handed to its opener with that listing (one listing per open).
fn open_listed(
    url: &str,
    level: crate::storage::object::source::Level,
    opts: &OpenOptions,
    progress: crate::progress::Progress,
    store: Arc<dyn ObjectStore>,
) -> Result<Dataset> {
    let cannot = || format!("cannot open {url}");
    let listed = store
        .list_below(url, level, progress)
        .with_context(cannot)?;
    let keys: Vec<String> = listed.iter().map(|l| l.key.clone()).collect();
    if keys.is_empty() {
        anyhow::bail!("cannot open {url}: no objects under this prefix");
    }
    if !remote_dir::holds_a_format(&keys) {
        return RemoteDir::open(url, listed, opts, &*store)
            .with_context(cannot)
            .map(|r| Dataset::RemoteDir(Box::new(r)));
    }
    let store: Arc<dyn ObjectStore> = Arc::new(ListedOnce {
        inner: store,
        url: url.to_string(),
        listed: std::sync::Mutex::new(Some(listed)),
    });
    open_remote_set(url, opts, progress, store)
}

/// An `https://host/dir/` directory. Its `.loosefs-index` is asked for first (an HTTP
/// listing hides names starting with `.`): a shared listing of loose objects is checked
/// against the directory's listing when the server gives one (2 requests); a foreign
/// dataset's shared index goes to that opener as fetched (1 request). With none, the
/// directory's listing: loose files or a packed format; without a listing, the dataset
/// opener (`index.json`, told the index is absent), else refused naming both ways.
fn open_http_dir(
    url: &str,
    opts: &OpenOptions,
    progress: crate::progress::Progress,
    store: Arc<dyn ObjectStore>,
) -> Result<Dataset> {
    use probed::{Answer, Probed};
    let cannot = || format!("cannot open {url}");
    let at = format!("{url}{}", crate::formats::index::shared::SUFFIX);
    let client = store.object(&at).with_context(cannot)?;
    let dir = crate::formats::index::cache_dir(opts.index_dir.as_deref());
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the index directory {}", dir.display()))?;
    let tmp = tempfile::NamedTempFile::new_in(&dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    let answer = match client.fetch_to(tmp.path()) {
        Ok(_) => {
            let bytes = std::fs::read(tmp.path())
                .with_context(|| format!("cannot read the shared index {at}"))?;
            match remote_dir::shared_listing::decode(&bytes, &at)? {
                Some(listed) => {
                    let stale = match store.list_level(url) {
                        Ok(level) => {
                            remote_dir::shared_listing::check_level(&level, &listed, &at, url).err()
                        }
                        Err(e) => {
                            log::info!(
                                "{at}: taken as it is, with nothing to check it against ({e:#})"
                            );
                            None
                        }
                    };
                    match stale {
                        None => {
                            let mut r =
                                RemoteDir::open(url, listed, opts, &*store).with_context(cannot)?;
                            r.shared = Some(at);
                            return Ok(Dataset::RemoteDir(Box::new(r)));
                        }
                        Some(e) if !opts.refresh_index => return Err(e),
                        // Over HTTP the listing cannot be written back: the directory's
                        // own listing is served, and the shared one left to its publisher.
                        Some(e) => {
                            let why = format!(
                                "{e:#}\n--refresh: serving the directory's listing instead (publish a new shared listing with `loosefs index {url} --out FILE`)"
                            );
                            log::warn!("{why}");
                            crate::eprintln_lossy!("loosefs: {why}");
                            Answer::Absent
                        }
                    }
                }
                None => Answer::Fetched(client, tmp.into_temp_path()),
            }
        }
        Err(e)
            if matches!(
                crate::storage::object::error_kind(&e),
                Some(std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied)
            ) =>
        {
            Answer::Absent
        }
        Err(e) => return Err(e.context(format!("cannot read the shared index {at}"))),
    };
    let foreign = matches!(answer, Answer::Fetched(..));
    let store: Arc<dyn ObjectStore> = Arc::new(Probed {
        inner: store,
        at: at.clone(),
        answer: std::sync::Mutex::new(Some(answer)),
    });
    if foreign {
        return open_remote_set(url, opts, progress, store);
    }
    match store.list_level(url) {
        Ok(level) => open_listed(url, level, opts, progress, store),
        Err(unlisted) => open_remote_set(url, opts, progress, store).map_err(|d| {
            crate::exit_code::joined(
                d,
                format!("\n  as loose files: {unlisted:#}\n  and there is no shared listing {at}"),
            )
        }),
    }
}

/// `loosefs index URL [--out DEST]`: the shared index of the dataset at `url`, written beside
/// it (or at `out`). An S3 prefix or listed HTTP directory of loose objects gets its listing
/// ([`remote_dir::listing`]); a foreign dataset its index ([`remote_dataset::shared`]).
/// Returns the line to print: where it went and what it holds.
///
/// Errors: the listing fails or is empty, the dataset cannot be indexed, the index cannot be
/// written or uploaded.
pub fn index_url(
    url: &str,
    out: Option<&Path>,
    args: &OpenOptions,
    store: Arc<dyn ObjectStore>,
    progress: crate::progress::Progress,
) -> Result<String> {
    let shape = SourceUrl::parse(url).map_or(Shape::Object, |s| s.shape);
    if let (Shape::Prefix { bucket }, None) = (shape, &args.format) {
        let cannot = || format!("cannot index {url}");
        let level = match store.list_level(url) {
            Ok(level) => level,
            // An HTTP directory its server does not list: a dataset by its `index.json`.
            Err(_) if !bucket => {
                return remote_dataset::shared::index(url, out, args, store, progress);
            }
            Err(e) => return Err(e.context(cannot())),
        };
        let listed = store
            .list_below(url, level, progress)
            .with_context(cannot)?;
        let keys: Vec<String> = listed.iter().map(|l| l.key.clone()).collect();
        if keys.is_empty() {
            anyhow::bail!("cannot index {url}: no objects under this prefix");
        }
        if !remote_dir::holds_a_format(&keys) {
            return remote_dir::shared_listing::write(url, &listed, out, &*store)
                .with_context(cannot);
        }
        let store: Arc<dyn ObjectStore> = Arc::new(ListedOnce {
            inner: store,
            url: url.to_string(),
            listed: std::sync::Mutex::new(Some(listed)),
        });
        return remote_dataset::shared::index(url, out, args, store, progress);
    }
    remote_dataset::shared::index(url, out, args, store, progress)
}

/// A store whose first LIST of `url` is answered from a listing made already (one LIST per
/// open, whichever opener needs it); everything else goes to `inner`.
#[derive(Debug)]
struct ListedOnce {
    inner: Arc<dyn ObjectStore>,
    url: String,
    listed: std::sync::Mutex<Option<Listing>>,
}

/// A prefix's listing: each key below it, with the pin its listing gave.
type Listing = Vec<crate::storage::object::source::Listed>;

impl ObjectStore for ListedOnce {
    fn object(&self, url: &str) -> Result<Arc<dyn crate::storage::object::source::ObjectSource>> {
        self.inner.object(url)
    }

    fn list(&self, url: &str) -> Result<Listing> {
        let kept = (url == self.url)
            .then(|| self.listed.lock().ok()?.take())
            .flatten();
        match kept {
            Some(l) => Ok(l),
            None => self.inner.list(url),
        }
    }

    fn upload(&self, url: &str, src: &Path) -> Result<()> {
        self.inner.upload(url, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_read_once_into_its_shape() {
        for (src, shape) in [
            ("s3://b/train/", Some(Shape::Prefix { bucket: true })),
            ("https://h/train/", Some(Shape::Prefix { bucket: false })),
            ("s3://b/part-{0..3}.tar", Some(Shape::Pattern)),
            ("s3://b/train.pack", Some(Shape::Object)),
            ("/data/train/", None),
        ] {
            assert_eq!(SourceUrl::parse(src).map(|s| s.shape), shape, "{src}");
        }
    }
}
