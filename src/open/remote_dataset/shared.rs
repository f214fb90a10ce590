//! Shared indexes of remote datasets: one index for every node. `loosefs index URL` writes
//! the index as an object beside the dataset (`<URL>.loosefs-index`: inside an S3 prefix,
//! `s3://b/mds/.loosefs-index`) or where `--out` says (an `s3://` URL or a local path), with
//! every object of the dataset named relative to the dataset's URL and pinned (size, ETag,
//! version). A mount finds it there (or takes `--index URL|PATH`) and, when its options fit,
//! uses it without downloading or scanning anything:
//! - an S3 prefix: the LIST that finds the objects also finds the index (no request when
//!   there is none); every object's ETag and size must match the listing, else the mount is
//!   refused naming the object that changed (stale);
//! - a brace pattern, one URL, an HTTPS directory: one GET of the index gives the objects'
//!   names and pins, and nothing else is requested before the first read; an object replaced
//!   since indexing is not seen at mount (HTTP cannot list) but answers EIO at its first
//!   read (If-Match), logged once, never served mixed.

use super::{Names, object_name};
use crate::formats::index::{self, Foreign, RemoteEntry, shared::SUFFIX};
use crate::open::OpenOptions;
use crate::open::discover::Probe;
use crate::open::url::SourceUrl;
use crate::storage::object::source::{ObjectStore, Pin};
use crate::storage::object::{error_kind, is_url};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a shared index of `url` is: `--index` (a URL or a local path) when given (`true`:
/// named, so it must exist and fit), else `<url>.loosefs-index`.
fn location(url: &str, args: &OpenOptions) -> (String, bool) {
    match &args.shared_index {
        Some(p) => (p.to_string_lossy().into_owned(), true),
        None => (format!("{url}{SUFFIX}"), false),
    }
}

/// The S3 listing of the dataset when it was listed: names, pins, and the pin of the
/// `.loosefs-index` object at the top of the prefix, if the listing had one.
pub(super) type Listed<'a> = (&'a [String], &'a [Option<Pin>], Option<&'a Pin>);

/// A shared index found for a mount.
pub(super) struct Found {
    /// The objects it records (`dir` they are named from, names, pins: the listing's when the
    /// dataset was listed).
    pub names: Names,
    /// The index: a local file named by `--index`, or the one fetched into the index directory
    /// under a temporary name (`fetched` > 0; the caller keeps it under the dataset's key).
    pub foreign: Foreign,
    /// Bytes received to fetch it (0: a local file).
    pub fetched: u64,
}

/// Looks for the shared index of the dataset at `url` (see the module note), `listed` by
/// discovery or not, and what discovery's `probe` of the default index found (fetched:
/// taken from that file; absent: not asked for again). `Ok(None)`: there is none (an
/// unnamed index missing, or built with other options than the mount's).
///
/// Errors: a named index missing or unreadable; not a shared index of a remote dataset;
/// built with other options (named only); stale against the listing (the message names the
/// object and says how to rebuild).
pub(super) fn find(
    url: &str,
    dir: &str,
    args: &OpenOptions,
    store: &dyn ObjectStore,
    (listed, probe): (Option<Listed<'_>>, Probe),
    index_dir: &Path,
) -> Result<Option<Found>> {
    let (at, named) = location(url, args);
    let mut fetched = 0;
    let path = if is_url(&at) && !named {
        match probe {
            Probe::Absent => return Ok(None),
            Probe::Fetched(_, file) => {
                let tmp = tmp_path(index_dir, &at)?;
                fetched = std::fs::metadata(&file)?.len().max(1);
                file.persist(&tmp)
                    .with_context(|| format!("cannot keep the shared index {at}"))?;
                Some(tmp)
            }
            Probe::NotAsked => None,
        }
    } else {
        None
    };
    let path = if let Some(path) = path {
        path
    } else if is_url(&at) {
        // The default index of a listed prefix is in the listing: none there, no request.
        let pin = match listed {
            Some((_, _, pin)) if !named => match pin {
                Some(p) => Some(p.clone()),
                None => return Ok(None),
            },
            _ => None,
        };
        let tmp = tmp_path(index_dir, &at)?;
        let client = store.object(&at)?;
        if let Some(p) = pin {
            client.set_pin(p);
        }
        match client.fetch_to(&tmp) {
            Ok(n) => {
                fetched = n.max(1);
                tmp
            }
            // Absent, or unreadable to us (S3 answers 403 for a missing key to a caller who
            // may not list the bucket): mounted without it.
            Err(e)
                if !named
                    && matches!(
                        error_kind(&e),
                        Some(std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied)
                    ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e.context(format!("cannot read the shared index {at}"))),
        }
    } else {
        PathBuf::from(&at)
    };
    let checked = check(
        &path,
        (&at, named),
        url,
        args,
        listed.map(|(n, p, _)| (n, p)),
    );
    if fetched > 0 && !matches!(checked, Ok(Some(_))) {
        let _ = std::fs::remove_file(&path);
    }
    Ok(checked?.map(|(names, pins, foreign)| Found {
        names: (dir.to_string(), names, pins),
        foreign,
        fetched,
    }))
}

/// Where a shared index fetched from `at` is kept in `index_dir` until its dataset's key is
/// known (the directory made if need be).
fn tmp_path(index_dir: &Path, at: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(index_dir)
        .with_context(|| format!("cannot create the index directory {}", index_dir.display()))?;
    Ok(index_dir.join(format!(
        "remote-shared-{:016x}.lfx",
        xxhash_rust::xxh3::xxh3_64(at.as_bytes())
    )))
}

/// A shared index that fits a mount: the dataset's object names, their pins, the index.
pub type Checked = (Vec<String>, Vec<Option<Pin>>, Foreign);

/// The shared index file at `path` (found at `at`, `named` by `--index` or not) checked for
/// the dataset at `url` as the mount's `args` ask for it: a shared index of a remote dataset,
/// built with the mount's options, naming only objects inside the dataset, and, when the
/// dataset was `listed` (names, pins), recording exactly the listed objects with their ETags and
/// sizes. Returns the objects' names and pins (the listing's, else the recorded ones) and the
/// index. `Ok(None)`: built with other options and not named.
///
/// Errors: not a loosefs index, damaged, not a shared index of a remote dataset, other options
/// (named), a name outside the dataset, stale against the listing (the object named).
pub fn check(
    path: &Path,
    (at, named): (&str, bool),
    url: &str,
    args: &OpenOptions,
    listed: Option<(&[String], &[Option<Pin>])>,
) -> Result<Option<Checked>> {
    let mut f = index::load(path).with_context(|| format!("cannot use the shared index {at}"))?;
    if !f.header.relative || f.header.remote.is_empty() {
        bail!(
            "{at} is not a shared index of a remote dataset (write one with `loosefs index {url}`)"
        );
    }
    let opts = args.scan_options()?;
    let wanted: Vec<String> = index::verify_accepted(&opts)
        .iter()
        .map(|v| index::options_string(f.header.format, &opts, v))
        .collect();
    let fmt_differs = opts.format.is_some_and(|x| x != f.header.format);
    if fmt_differs || !wanted.contains(&f.header.options) {
        if named {
            bail!(
                "the shared index {at} was built with other options ({}) than this mount's ({})",
                f.header.options,
                wanted[0]
            );
        }
        log::warn!("{at} was built with other options; not used");
        return Ok(None);
    }
    check_names(&f, at)?;
    let (names, pins) = match listed {
        // The listing's names in its order, with its pins: the same objects (checked).
        Some((lnames, lpins)) => {
            stale_check(&f.header.remote, lnames, lpins, at, url)?;
            (lnames.to_vec(), lpins.to_vec())
        }
        None => (f.header.remote.iter())
            .map(|e| (e.name.clone(), Some(super::pin_of(e))))
            .unzip(),
    };
    f.header.source = PathBuf::from(url);
    Ok(Some((names, pins, f)))
}

/// Every object the index's samples come from is one of its recorded objects, and no name
/// climbs out of the dataset. Errors name the index.
fn check_names(f: &Foreign, at: &str) -> Result<()> {
    for e in &f.header.remote {
        if !super::safe_name(&e.name) {
            bail!("{at}: names {:?} outside the dataset", e.name);
        }
    }
    for o in &f.header.objects {
        let n = object_name(&f.header, o);
        if !n.is_some_and(|n| f.header.remote.iter().any(|e| e.name == n)) {
            bail!(
                "{at}: its samples come from {} which it does not record",
                o.path.display()
            );
        }
    }
    Ok(())
}

/// The index's objects against the listing now: the same names, each with its ETag and
/// size. Errors (stale) name the first object that differs.
fn stale_check(
    recorded: &[RemoteEntry],
    names: &[String],
    pins: &[Option<Pin>],
    at: &str,
    url: &str,
) -> Result<()> {
    let stale = |name: &str, why: String| {
        crate::exit_code::refuse(
            crate::exit_code::ExitKind::Changed,
            format!(
                "the shared index {at} is stale: {url}{name} {why} since it was indexed; run `loosefs index {url}` again"
            ),
        )
    };
    for e in recorded {
        let Some(i) = names.iter().position(|n| *n == e.name) else {
            return Err(stale(&e.name, "is gone".into()));
        };
        match &pins[i] {
            Some(p) if p.etag == e.etag && p.size == e.size => {}
            Some(p) => {
                return Err(stale(
                    &e.name,
                    format!(
                        "changed (ETag {} and {} bytes, now {} and {} bytes)",
                        e.etag, e.size, p.etag, p.size
                    ),
                ));
            }
            None => return Err(stale(&e.name, "has no ETag in the listing".into())),
        }
    }
    if let Some(n) = names
        .iter()
        .find(|n| !recorded.iter().any(|e| e.name == **n))
    {
        return Err(stale(n, "was added".into()));
    }
    Ok(())
}

/// Writes the shared index of the opened dataset `ds` to `out` (an `s3://` URL or a local
/// path), by default `<URL>.loosefs-index` on S3. Returns where it went.
///
/// Errors: the default over HTTPS (which cannot be written: give `--out PATH` and publish the
/// file at that URL), an upload refused, a local file that cannot be written.
pub fn write(ds: &super::RemoteDataset, out: Option<&Path>, index_dir: &Path) -> Result<String> {
    let url = ds.url();
    let dest = match out {
        Some(p) => p.to_string_lossy().into_owned(),
        None if crate::storage::object::is_bucket_url(url) => format!("{url}{SUFFIX}"),
        None => bail!(
            "{url}: an index cannot be written over HTTP(S); give --out PATH and publish that file at {url}{SUFFIX} (or pass its URL to mounts with --index)"
        ),
    };
    let f = &ds.foreign;
    let names = (f.header.objects.iter())
        .map(|o| object_name(&f.header, o).context("an object outside the dataset"))
        .collect::<Result<Vec<_>>>()?;
    let local = if is_url(&dest) {
        if !crate::storage::object::is_bucket_url(&dest) {
            bail!(
                "{dest}: an index is written to a bucket ({}) or a local path",
                crate::storage::object::bucket_forms()
            );
        }
        std::fs::create_dir_all(index_dir).with_context(|| {
            format!("cannot create the index directory {}", index_dir.display())
        })?;
        index_dir.join(format!("upload-{}.lfx", std::process::id()))
    } else {
        PathBuf::from(&dest)
    };
    index::shared::write_remote(f, url, &names, ds.objects.clone(), &local)?;
    if is_url(&dest) {
        let up = (ds.store.upload(&dest, &local))
            .with_context(|| format!("cannot upload the index to {dest}"));
        let _ = std::fs::remove_file(&local);
        up?;
    }
    Ok(dest)
}

/// `loosefs index URL [--out DEST]`: the dataset at `src` (its prefix `listed` by discovery,
/// or not) indexed as it is now (downloaded once into
/// the block cache and scanned, or its kept index reused) and written as a shared index
/// ([`write`]). Returns the line to print: where it went and what it holds.
pub(crate) fn index(
    src: &SourceUrl,
    listed: Option<Vec<crate::storage::object::source::Listed>>,
    out: Option<&Path>,
    args: &OpenOptions,
    store: Arc<dyn ObjectStore>,
    progress: crate::progress::Progress,
) -> Result<String> {
    let url = src.url.as_str();
    let ds = super::RemoteDataset::open_unshared(src, listed, args, progress, store)?;
    let dir = index::cache_dir(args.index_dir.as_deref());
    let dest = write(&ds, out, &dir)?;
    let i = ds.info();
    Ok(format!(
        "{dest}: shared index of {url} ({}, {} samples in {} objects, verify {}); mounts of it use it while every object keeps its ETag",
        i.format, i.samples, i.files, i.verify
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, etag: &str, size: u64) -> RemoteEntry {
        RemoteEntry {
            name: name.into(),
            size,
            etag: etag.into(),
            version: None,
        }
    }

    fn pin(etag: &str, size: u64) -> Option<Pin> {
        Some(Pin {
            size,
            etag: etag.into(),
            version: None,
            modified: None,
        })
    }

    #[test]
    fn a_listing_that_differs_from_the_index_names_the_object() {
        let rec = [entry("a.tar", "\"1\"", 10), entry("b.tar", "\"2\"", 20)];
        let names = ["a.tar".to_string(), "b.tar".to_string()];
        let ok = stale_check(
            &rec,
            &names,
            &[pin("\"1\"", 10), pin("\"2\"", 20)],
            "I",
            "s3://b/d/",
        );
        assert!(ok.is_ok());
        let e = stale_check(
            &rec,
            &names,
            &[pin("\"1\"", 10), pin("\"3\"", 20)],
            "I",
            "s3://b/d/",
        );
        let e = e.unwrap_err().to_string();
        assert!(e.contains("is stale: s3://b/d/b.tar changed"), "{e}");
        let e = stale_check(&rec, &names[..1], &[pin("\"1\"", 10)], "I", "s3://b/d/");
        assert!(e.unwrap_err().to_string().contains("b.tar is gone"));
        let more = [
            "a.tar".to_string(),
            "b.tar".to_string(),
            "c.tar".to_string(),
        ];
        let pins = [pin("\"1\"", 10), pin("\"2\"", 20), pin("\"9\"", 5)];
        let e = stale_check(&rec, &more, &pins, "I", "s3://b/d/");
        assert!(e.unwrap_err().to_string().contains("c.tar was added"));
        let e = stale_check(
            &rec,
            &names,
            &[pin("\"1\"", 10), pin("\"2\"", 21)],
            "I",
            "u/",
        );
        assert!(e.unwrap_err().to_string().contains("u/b.tar changed"));
    }

    #[test]
    fn the_default_index_sits_beside_the_dataset_and_index_names_another() {
        let args = OpenOptions::default();
        assert_eq!(
            location("s3://b/mds/", &args),
            ("s3://b/mds/.loosefs-index".to_string(), false)
        );
        assert_eq!(
            location("https://h/a.zip", &args).0,
            "https://h/a.zip.loosefs-index"
        );
        let args = OpenOptions {
            shared_index: Some(PathBuf::from("/nfs/i.loosefs-index")),
            ..OpenOptions::default()
        };
        assert_eq!(
            location("s3://b/mds/", &args),
            ("/nfs/i.loosefs-index".to_string(), true)
        );
    }
}
