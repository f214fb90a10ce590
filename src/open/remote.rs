//! A source at a URL, for a command: what it holds found once ([`super::discover`]), then
//! opened for a mount ([`open`]) or indexed by `loosefs index URL` ([`index_url`]) from that
//! one answer.

use super::discover::{Holds, Lead, NotRecognised, Purpose, discover};
use super::remote_dataset::RemoteDataset;
use super::remote_dir::{self, RemoteDir};
use super::url::SourceUrl;
use super::{Dataset, OpenOptions};
use crate::exit_code::{ExitKind, refuse, with_kind};
use crate::storage::object::source::{Level, ObjectStore};
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Arc;

/// Opens for a mount what `src` holds ([`discover`]): a pack, loose objects (from a listing
/// made now or a shared listing), or a foreign dataset handed what discovery learnt of it.
/// A stale shared listing is refused (exit code 75) unless `--refresh` asks to list again.
///
/// Errors: as [`discover`]'s; the opener's (a damaged or unreadable dataset, a cache root
/// that cannot be used); a source no way recognised ([`NotRecognised`], naming each way).
pub(super) fn open(
    src: &SourceUrl,
    opts: &OpenOptions,
    progress: crate::progress::Progress,
    store: Arc<dyn ObjectStore>,
) -> Result<Dataset> {
    let url = src.url.as_str();
    let cannot = || format!("cannot open {url}");
    match discover(src, opts, Purpose::Mount, progress, &store)? {
        Holds::Pack(r) => Ok(Dataset::Remote(r)),
        Holds::Loose { listed, shared } => {
            let mut r = RemoteDir::open(url, listed, opts, &*store).with_context(cannot)?;
            r.shared = shared;
            Ok(Dataset::RemoteDir(Box::new(r)))
        }
        Holds::Stale { stale, level } if opts.refresh_index => {
            refresh(url, &stale.at, level, opts, progress, store)
        }
        Holds::Stale { stale, .. } => {
            Err(with_kind(anyhow::Error::new(stale), ExitKind::Changed).context(cannot()))
        }
        Holds::Dataset(lead) => dataset(src, lead, opts, progress, store),
    }
}

/// The foreign dataset `src` as its opener finds it from `lead`; refused naming every way
/// tried when none recognised it.
fn dataset(
    src: &SourceUrl,
    lead: Lead,
    opts: &OpenOptions,
    progress: crate::progress::Progress,
    store: Arc<dyn ObjectStore>,
) -> Result<Dataset> {
    let Lead {
        listed,
        shared_index,
        tried,
    } = lead;
    RemoteDataset::open(src, listed, shared_index, opts, progress, store)
        .map(|r| Dataset::RemoteSet(Box::new(r)))
        .map_err(|e| {
            NotRecognised::wrap(e, format!("cannot open {}", src.url), tried, "as a dataset")
        })
}

/// `--refresh` of the prefix `url` (first level `level`) whose shared listing `at` is
/// stale: the prefix listed again, the new listing written over `at` (a warning if it
/// cannot be, as over HTTP: the mount goes on from the fresh listing), then served as loose
/// files.
fn refresh(
    url: &str,
    at: &str,
    level: Level,
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

/// `loosefs index URL [--out DEST]`: the shared index of what `url` holds (discovered as a
/// mount discovers it, `open/discover.rs`), written beside it (or at `out`): loose objects
/// get their listing ([`remote_dir::shared_listing::write`]), a foreign dataset its index
/// (`remote_dataset::shared::index`). Returns the line to print: where it went and what it
/// holds.
///
/// Errors: as discovery's (a listing or GET that fails, an empty prefix); a loosefs pack (its index is inside it: bad usage, 2); the
/// dataset cannot be indexed; the index cannot be written or uploaded.
pub fn index_url(
    url: &str,
    out: Option<&Path>,
    args: &OpenOptions,
    store: Arc<dyn ObjectStore>,
    progress: crate::progress::Progress,
) -> Result<String> {
    let Some(src) = SourceUrl::parse(url) else {
        return Err(refuse(
            ExitKind::Usage,
            format!(
                "{url}: not a URL (`loosefs index` writes the shared index of a remote dataset)"
            ),
        ));
    };
    let cannot = || format!("cannot index {url}");
    match discover(&src, args, Purpose::Index, progress, &store)? {
        Holds::Pack(_) => Err(refuse(
            ExitKind::Usage,
            format!(
                "cannot index {url}: it is a loosefs pack, whose index is inside it (`loosefs index` writes the shared index of loose objects or of a dataset in another format)"
            ),
        )),
        Holds::Loose { listed, .. } => {
            remote_dir::shared_listing::write(url, &listed, out, &*store).with_context(cannot)
        }
        Holds::Stale { stale, .. } => Err(anyhow::Error::new(stale).context(cannot())),
        Holds::Dataset(lead) => {
            let Lead { listed, tried, .. } = lead;
            super::remote_dataset::shared::index(&src, listed, out, args, store, progress)
                .map_err(|e| NotRecognised::wrap(e, cannot(), tried, "as a dataset"))
        }
    }
}
