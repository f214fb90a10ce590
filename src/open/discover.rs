//! Discovery: what a source URL holds, found once by a documented sequence of probes and
//! returned as a value ([`Holds`]). `mount` opens that value ([`super::remote::open`]) and
//! `loosefs index` indexes it ([`super::remote::index_url`]): "what a prefix is" is decided here
//! alone, and what a probe fetched is handed on inside the value, never asked for twice.
//!
//! The sequence (`--format` given, or `--offline`: a foreign dataset, nothing asked here):
//! 1. **A prefix** (`…/`) of a bucket store, or of an HTTP server with `--index` named, or
//!    any prefix for `loosefs index`: its first level listed (1 LIST; an HTTP server may list
//!    none). For a mount, a shared listing `.loosefs-index` found there (or `--index`) is
//!    taken, checked against that level (1 GET): [`Holds::Loose`], or [`Holds::Stale`]. Else
//!    the prefix listed whole: loose files ([`Holds::Loose`]), or a packed format's shards when
//!    the names say so ([`crate::formats::registry::holds_a_format`]): a [`Holds::Dataset`]
//!    with that listing. Not listed: a dataset read from its `index.json`.
//! 2. **A directory** (`…/`) of an HTTP server, for a mount: `.loosefs-index` asked for first
//!    (a listing hides dot names): a shared listing (checked against the server's listing
//!    when it gives one), or a foreign dataset's shared index (handed on as fetched); else
//!    as in 1, the shared index known to be absent.
//! 3. **A brace pattern** (`…/{0..9}.tar`): a dataset, nothing asked here.
//! 4. **One object**: a native pack (a suffix GET of its trailer, [`Holds::Pack`]); not a
//!    pack: one object in another format (zip, `.beton`, Parquet, tar), with the pack's
//!    refusal kept to name if that fails too ([`NotRecognised`]).

use super::remote_dir::shared_listing::{self, Stale};
use super::remote_pack::RemotePack;
use super::url::{Shape, SourceUrl};
use super::{OpenError, OpenOptions};
use crate::formats::index::shared::SUFFIX;
use crate::storage::object::source::{Level, Listed, ObjectSource, ObjectStore};
use anyhow::{Context, Result};
use std::sync::Arc;

/// Why a URL is discovered: what a mount looks for that an index does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A mount: shared listings and shared indexes are looked for and taken.
    Mount,
    /// `loosefs index`: the source as it is now; no shared listing or index is looked for.
    Index,
}

/// What a source URL holds.
#[derive(Debug)]
pub(crate) enum Holds {
    /// A loosefs pack, its trailer and index read.
    Pack(RemotePack),
    /// Loose objects below a prefix: every key with its pin, and where the shared listing
    /// they came from was read (`None`: listed now).
    Loose {
        listed: Vec<Listed>,
        shared: Option<String>,
    },
    /// A prefix whose shared listing no longer matches its first level (a mount only).
    Stale { stale: Stale, level: Level },
    /// A dataset in another format, with what discovery learnt of its objects.
    Dataset(Lead),
}

/// What discovery learnt of a foreign dataset's objects, for its opener.
#[derive(Debug, Default)]
pub(crate) struct Lead {
    /// The prefix listed whole (its names say a packed format). `None`: not listed (a pattern,
    /// one object, `--format` or `--offline`, an HTTP directory its server does not list).
    pub listed: Option<Vec<Listed>>,
    /// The default shared index as asked for here.
    pub shared_index: Probe,
    /// The other ways the URL was tried, each with why it is not that (named if the dataset
    /// opener fails too).
    pub tried: Vec<Tried>,
}

/// One object asked for while telling a source apart (an HTTP directory's
/// `.loosefs-index`, which its listing hides), handed on so that it is not asked for twice.
#[derive(Debug, Default)]
pub(crate) enum Probe {
    /// Not asked for here: the opener asks for it if it wants it.
    #[default]
    NotAsked,
    /// No such object (404, or 403 to a caller who may not list).
    Absent,
    /// Fetched whole into this file, by this client (pinned to the answer, its GET counted).
    Fetched(Arc<dyn ObjectSource>, tempfile::TempPath),
}

/// A way a URL was tried and why it is not that.
#[derive(Debug)]
pub struct Tried {
    /// The way, as said to the user (`as a loosefs pack`).
    pub way: &'static str,
    /// Why not.
    pub why: String,
}

/// A source that none of the ways tried recognised. Carried as the context of the last way's
/// failure, whose causes follow it (and give the exit code, [`crate::exit_code`]).
#[derive(Debug)]
pub struct NotRecognised {
    /// What failed (`cannot open URL`).
    pub head: String,
    /// The ways tried before the last, each with why not.
    pub tried: Vec<Tried>,
    /// The last way tried (its failure is this error's cause).
    pub last: &'static str,
}

impl std::fmt::Display for NotRecognised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.head)?;
        for t in &self.tried {
            write!(f, "\n  {}: {}", t.way, t.why)?;
        }
        write!(f, "\n  {}", self.last)
    }
}

impl NotRecognised {
    /// `e` (the last way's failure) under `head`, with the ways `tried` before it named
    /// between them; just `e` under `head` when nothing else was tried.
    pub(crate) fn wrap(
        e: anyhow::Error,
        head: String,
        tried: Vec<Tried>,
        last: &'static str,
    ) -> anyhow::Error {
        if tried.is_empty() {
            return e.context(head);
        }
        e.context(NotRecognised { head, tried, last })
    }
}

/// What `src` holds, by the sequence in this module's documentation.
///
/// Errors: a LIST or GET that fails where no other way is left (a bucket prefix that cannot be
/// listed, an object that is missing: the message says if a prefix of that name exists), an
/// empty prefix, a shared listing that cannot be read or is damaged, a damaged pack.
pub(crate) fn discover(
    src: &SourceUrl,
    opts: &OpenOptions,
    purpose: Purpose,
    progress: crate::progress::Progress,
    store: &Arc<dyn ObjectStore>,
) -> Result<Holds> {
    let url = src.url.as_str();
    if opts.format.is_some() || (opts.remote.offline && src.shape != Shape::Object) {
        return Ok(Holds::Dataset(Lead::default()));
    }
    match src.shape {
        Shape::Prefix { bucket: false }
            if purpose == Purpose::Mount && opts.shared_index.is_none() =>
        {
            http_dir(url, opts, progress, store)
        }
        Shape::Prefix { bucket } => prefix(url, bucket, opts, purpose, progress, store),
        Shape::Pattern => Ok(Holds::Dataset(Lead::default())),
        Shape::Object => object(url, opts, store),
    }
}

/// One object: a pack, or one object of a dataset.
fn object(url: &str, opts: &OpenOptions, store: &Arc<dyn ObjectStore>) -> Result<Holds> {
    let not_a_pack = |e: OpenError| {
        Ok(Holds::Dataset(Lead {
            tried: vec![Tried {
                way: "as a loosefs pack",
                why: format!("{e:#}"),
            }],
            ..Lead::default()
        }))
    };
    match RemotePack::open(url, &**store, &opts.remote) {
        Ok(r) => Ok(Holds::Pack(r)),
        Err(e @ OpenError::NotAPack { .. }) => not_a_pack(e),
        Err(e) if opts.remote.offline => not_a_pack(e),
        Err(OpenError::Other(e))
            if crate::storage::object::error_kind(&e) == Some(std::io::ErrorKind::NotFound) =>
        {
            Err(e.context(format!("cannot open {url}{}", prefix_hint(url, &**store))))
        }
        // The error itself, not a transparent wrapper that would hide its type (and so its
        // exit code, `crate::exit_code`).
        Err(OpenError::Other(e)) => Err(e.context(format!("cannot open {url}"))),
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

/// A prefix (step 1): its first level, a shared listing there (a mount), then the whole listing.
fn prefix(
    url: &str,
    bucket: bool,
    opts: &OpenOptions,
    purpose: Purpose,
    progress: crate::progress::Progress,
    store: &Arc<dyn ObjectStore>,
) -> Result<Holds> {
    let cannot = || format!("cannot open {url}");
    // An HTTP directory may have no listing: a named shared listing may describe it.
    let level = match store.list_level(url) {
        Err(e) if bucket => return Err(e.context(cannot())),
        l => l,
    };
    if purpose == Purpose::Mount {
        let found = shared_listing::find(url, bucket, level.as_ref().ok(), opts, &**store)
            .with_context(cannot)?;
        match (found, level) {
            (shared_listing::Found::Fresh(listed, at), _) => {
                return Ok(Holds::Loose {
                    listed,
                    shared: Some(at),
                });
            }
            (shared_listing::Found::Stale(stale), Ok(level)) => {
                return Ok(Holds::Stale { stale, level });
            }
            (_, l) => return listed_or_not(url, l, progress, store),
        }
    }
    listed_or_not(url, level, progress, store)
}

/// The prefix `url` by its first level: listed whole ([`whole`]), or, as its server lists
/// none (`unlisted`), a dataset to find by its `index.json`.
fn listed_or_not(
    url: &str,
    level: Result<Level>,
    progress: crate::progress::Progress,
    store: &Arc<dyn ObjectStore>,
) -> Result<Holds> {
    match level {
        Ok(level) => whole(url, level, Probe::NotAsked, progress, store),
        Err(unlisted) => Ok(Holds::Dataset(Lead {
            tried: vec![Tried {
                way: "as loose files",
                why: format!("{unlisted:#}"),
            }],
            ..Lead::default()
        })),
    }
}

/// The prefix `url` whose first level is `level`, listed whole: loose files, or a packed
/// format's shards (handed on with that listing and what asking for its shared index found).
fn whole(
    url: &str,
    level: Level,
    shared_index: Probe,
    progress: crate::progress::Progress,
    store: &Arc<dyn ObjectStore>,
) -> Result<Holds> {
    let listed = store
        .list_below(url, level, progress)
        .with_context(|| format!("cannot open {url}"))?;
    if listed.is_empty() {
        anyhow::bail!("cannot open {url}: no objects under this prefix");
    }
    let keys: Vec<String> = listed.iter().map(|l| l.key.clone()).collect();
    if !super::remote_dir::holds_a_format(&keys) {
        return Ok(Holds::Loose {
            listed,
            shared: None,
        });
    }
    Ok(Holds::Dataset(Lead {
        listed: Some(listed),
        shared_index,
        tried: Vec::new(),
    }))
}

/// An HTTP directory (step 2): its `.loosefs-index` asked for first (an HTTP listing hides
/// names starting with `.`): a shared listing of loose objects, checked against the
/// directory's listing when the server gives one (2 requests); a foreign dataset's shared
/// index, handed on as fetched (1 request). With none, the directory's listing, the index
/// known to be absent; without a listing, the dataset opener (`index.json`).
fn http_dir(
    url: &str,
    opts: &OpenOptions,
    progress: crate::progress::Progress,
    store: &Arc<dyn ObjectStore>,
) -> Result<Holds> {
    let at = format!("{url}{SUFFIX}");
    let probe = match probe(&at, opts, &**store).with_context(|| format!("cannot open {url}"))? {
        Probe::Fetched(client, file) => {
            let bytes = std::fs::read(&file)
                .with_context(|| format!("cannot read the shared index {at}"))?;
            let Some(listed) = shared_listing::decode(&bytes, &at)? else {
                return Ok(Holds::Dataset(Lead {
                    shared_index: Probe::Fetched(client, file),
                    ..Lead::default()
                }));
            };
            return Ok(match store.list_level(url) {
                Ok(level) => match shared_listing::check_level(&level, &listed, &at, url) {
                    Ok(()) => Holds::Loose {
                        listed,
                        shared: Some(at),
                    },
                    Err(stale) => Holds::Stale { stale, level },
                },
                Err(e) => {
                    log::info!("{at}: taken as it is, with nothing to check it against ({e:#})");
                    Holds::Loose {
                        listed,
                        shared: Some(at),
                    }
                }
            });
        }
        p => p,
    };
    match store.list_level(url) {
        Ok(level) => whole(url, level, probe, progress, store),
        Err(unlisted) => Ok(Holds::Dataset(Lead {
            shared_index: probe,
            tried: vec![
                Tried {
                    way: "as loose files",
                    why: format!("{unlisted:#}"),
                },
                Tried {
                    way: "as a shared listing",
                    why: format!("there is no {at}"),
                },
            ],
            ..Lead::default()
        })),
    }
}

/// Asks for the object `at` whole: fetched into the index directory, or absent (404, or 403
/// to a caller who may not list).
///
/// Errors: the index directory cannot be made or written; the GET fails otherwise.
fn probe(at: &str, opts: &OpenOptions, store: &dyn ObjectStore) -> Result<Probe> {
    let client = store.object(at)?;
    let tmp = crate::formats::index::temp_file(opts.index_dir.as_deref())?;
    match client.fetch_to(tmp.path()) {
        Ok(_) => Ok(Probe::Fetched(client, tmp.into_temp_path())),
        Err(e)
            if matches!(
                crate::storage::object::error_kind(&e),
                Some(std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied)
            ) =>
        {
            Ok(Probe::Absent)
        }
        Err(e) => Err(e.context(format!("cannot read the shared index {at}"))),
    }
}
