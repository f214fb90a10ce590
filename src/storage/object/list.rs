//! How a client lists the objects of a prefix: S3's paginated LIST (the first level with
//! `delimiter=/`, then the first page of the whole listing, then runs of subdirectories at
//! once), or an HTTP server's directory listings ([`super::super::http_listing`]).

use super::ObjectClient;
use super::errors::describe;
use super::store::Lister;
use crate::storage::object::source::{Level, Listed, Pin};
use anyhow::{Result, anyhow};
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

/// Runs of a prefix's subdirectories listed at once, each its own sequence of LIST requests.
pub const LISTS_AT_ONCE: usize = 16;

/// `path` relative to `prefix`, its parts joined by `/` (`None`: not below it, or `prefix`
/// itself).
fn relative(prefix: &ObjectPath, path: &ObjectPath) -> Option<String> {
    let rel: Vec<String> = (path.prefix_match(prefix)?)
        .map(|p| p.as_ref().to_string())
        .collect();
    Some(rel.join("/")).filter(|r| !r.is_empty())
}

/// `prefix` as the start of its keys: `prefix/`, or nothing for a bucket's root.
fn as_dir(prefix: &ObjectPath) -> String {
    match prefix.as_ref() {
        "" => String::new(),
        p => format!("{p}/"),
    }
}

/// The listing's entry `m` relative to `prefix` (`None`: not below it).
fn listed(prefix: &ObjectPath, m: object_store::ObjectMeta) -> Option<Listed> {
    let key = relative(prefix, &m.location)?;
    let pin = m.e_tag.map(|etag| Pin {
        size: m.size,
        etag: super::quoted_etag(&etag),
        version: m.version,
        modified: None,
    });
    Some(Listed {
        key,
        pin,
        modified: m.last_modified.timestamp(),
    })
}

/// Objects of a prefix: found by a listing, pinned to what it says.
impl ObjectClient {
    /// Every object under this client's key taken as a prefix (`s3://bucket/prefix/`), as
    /// (key relative to the prefix, what the listing says it is: size, ETag, version), sorted
    /// by key: its first level, then its subdirectories concurrently ([`Self::list_below`]).
    /// Errors: the listing is refused (403), or the store cannot list (HTTP).
    pub fn list(&self) -> Result<Vec<Listed>> {
        self.list_below(self.list_level()?, crate::progress::Progress::None)
    }

    /// The first level under this client's key taken as a prefix: one LIST with
    /// `delimiter=/`, its first page (up to 1000 entries; [`Level::more`] tells the rest is
    /// unlisted). Errors: as [`Self::list`].
    pub fn list_level(&self) -> Result<Level> {
        let url = self.url.clone();
        let prefix = self.path.clone();
        let cannot =
            |e: object_store::Error| anyhow!("{url}: cannot list the prefix: {}", describe(&e));
        let (r, more) = match &self.lister {
            Lister::Dirs(dirs) => return self.rt.block_on(dirs.level(&self.url)),
            Lister::Pages(pages) => {
                let opts = object_store::list::PaginatedListOptions {
                    delimiter: Some("/".into()),
                    ..Default::default()
                };
                let page = (self.rt)
                    .block_on(pages.list_paginated(Some(&as_dir(&prefix)), opts))
                    .map_err(cannot)?;
                (page.result, page.page_token)
            }
        };
        let mut objects: Vec<Listed> = (r.objects.into_iter())
            .filter_map(|m| listed(&prefix, m))
            .collect();
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        let mut dirs: Vec<String> = (r.common_prefixes.iter())
            .filter_map(|p| relative(&prefix, p))
            .collect();
        dirs.sort();
        Ok(Level {
            objects,
            dirs,
            more,
        })
    }

    /// Every object under this client's key taken as a prefix whose first level is `level`:
    /// `level`'s objects and those below its subdirectories, sorted by key. One LIST of the
    /// first 1000 keys, which is all for a prefix that holds no more; past them, the
    /// subdirectories not reached are split into up to [`LISTS_AT_ONCE`] runs, contiguous in
    /// key order, listed at once (with the rest of the first page's): a run's first
    /// subdirectory by its prefix, then on from its last key (`start-after`) to the next run's
    /// first: about one LIST per 1000 keys plus two per run, in the time of the longest run.
    /// `progress` shows a count of the keys listed. Errors: as [`Self::list`].
    pub fn list_below(
        &self,
        level: Level,
        progress: crate::progress::Progress,
    ) -> Result<Vec<Listed>> {
        use futures::{StreamExt, TryStreamExt};
        let url = self.url.clone();
        let prefix = self.path.clone();
        let pages = match &self.lister {
            Lister::Pages(pages) => pages,
            Lister::Dirs(dirs) => {
                return (self.rt).block_on(dirs.below(&self.url, level, LISTS_AT_ONCE));
            }
        };
        let level = match &level.more {
            Some(token) => self.rest_of_level(level.clone(), token, pages)?,
            None => level,
        };
        if level.dirs.is_empty() {
            return Ok(level.objects);
        }
        let base = as_dir(&prefix);
        let skip = base.len();
        // The first page of the whole listing: a prefix of up to 1000 keys needs no more.
        let opts = object_store::list::PaginatedListOptions::default();
        let page = (self.rt)
            .block_on(pages.list_paginated(Some(&base), opts))
            .map_err(|e| anyhow!("{url}: cannot list the prefix: {}", describe(&e)))?;
        let after: Option<ObjectPath> = page.result.objects.last().map(|m| m.location.clone());
        let mut found_first = page.result.objects;
        found_first.retain(|m| m.location.as_ref()[skip..].contains('/'));
        if page.page_token.is_none() {
            let mut v = level.objects;
            v.extend(found_first.into_iter().filter_map(|m| listed(&prefix, m)));
            v.sort_by(|a, b| a.key.cmp(&b.key));
            return Ok(v);
        }
        // A count of the keys listed: a prefix of millions takes a while.
        let bar = progress.meter("list", crate::progress::Unit::Objects, None);
        bar.inc(found_first.len() as u64);
        let bar = &bar;
        // In key order (`a-b/` lists before `a/`), those the first page did not reach.
        let mut dirs: Vec<String> = (level.dirs.iter())
            .map(|d| format!("{base}{d}/"))
            .filter(|d| after.as_ref().is_none_or(|a| d.as_str() > a.as_ref()))
            .collect();
        dirs.sort();
        // Runs: (first subdirectory, or none: on from the first page's last key; list on
        // past the first subdirectory; where the next run starts).
        let mut runs: Vec<(Option<String>, bool, Option<String>)> = Vec::new();
        if after.is_some() {
            runs.push((None, true, dirs.first().cloned()));
        }
        if !dirs.is_empty() {
            let per = dirs.len().div_ceil(LISTS_AT_ONCE.min(dirs.len()));
            for i in (0..dirs.len()).step_by(per) {
                let more = i + 1 < dirs.len() && per > 1;
                runs.push((Some(dirs[i].clone()), more, dirs.get(i + per).cloned()));
            }
        }
        let runs = runs.into_iter().map(|(first, more, end)| {
            let (store, prefix) = (self.store.clone(), prefix.clone());
            let mut from = after.clone();
            async move {
                let err = |e: object_store::Error| anyhow!("{}", describe(&e));
                let mut found = Vec::new();
                // The run's first subdirectory by itself (its prefix: right in every store) ...
                if let Some(first) = first {
                    let at = ObjectPath::parse(&first[..first.len() - 1])
                        .map_err(|e| anyhow!("{first}: {e}"))?;
                    found = store.list(Some(&at)).try_collect().await.map_err(err)?;
                    bar.inc(found.len() as u64);
                    from = found
                        .last()
                        .map(|m: &object_store::ObjectMeta| m.location.clone());
                }
                // ... then on from its last key (`start-after`: a real key, which every store
                // orders as S3 does), to the next run's first.
                let Some(from) = from.filter(|_| more) else {
                    return Ok::<_, anyhow::Error>(found);
                };
                let mut keys = store.list_with_offset(Some(&prefix), &from);
                while let Some(m) = keys.try_next().await.map_err(err)? {
                    let k = m.location.as_ref();
                    if end.as_deref().is_some_and(|e| k >= e) {
                        break;
                    }
                    if k[skip..].contains('/') {
                        bar.inc(1);
                        found.push(m);
                    }
                }
                Ok(found)
            }
        });
        let found: Vec<Vec<_>> = self
            .rt
            .block_on(
                futures::stream::iter(runs)
                    .buffer_unordered(LISTS_AT_ONCE)
                    .try_collect(),
            )
            .map_err(|e| anyhow!("{url}: cannot list the prefix: {e:#}"))?;
        bar.finish_and_clear();
        let mut v = level.objects;
        v.extend(
            (found_first.into_iter().chain(found.into_iter().flatten()))
                .filter_map(|m| listed(&prefix, m)),
        );
        v.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(v)
    }

    /// `level` (a first page) with the rest of its pages, from the page token `token`.
    fn rest_of_level(
        &self,
        mut level: Level,
        token: &str,
        pages: &super::store::Pages,
    ) -> Result<Level> {
        let url = self.url.clone();
        let at = as_dir(&self.path);
        let mut token = Some(token.to_string());
        // A server that hands out a token it gave before would be listed forever.
        let mut seen = std::collections::HashSet::new();
        while let Some(t) = token.take() {
            if !seen.insert(t.clone()) {
                anyhow::bail!(
                    "{url}: cannot list the prefix: the server gave the continuation token {t:?} \
                     twice (it would be listed forever)"
                );
            }
            let opts = object_store::list::PaginatedListOptions {
                delimiter: Some("/".into()),
                page_token: Some(t),
                ..Default::default()
            };
            let page = (self.rt)
                .block_on(pages.list_paginated(Some(&at), opts))
                .map_err(|e| anyhow!("{url}: cannot list the prefix: {}", describe(&e)))?;
            level.objects.extend(
                page.result
                    .objects
                    .into_iter()
                    .filter_map(|m| listed(&self.path, m)),
            );
            level.dirs.extend(
                (page.result.common_prefixes.iter()).filter_map(|p| relative(&self.path, p)),
            );
            token = page.page_token;
        }
        level.objects.sort_by(|a, b| a.key.cmp(&b.key));
        level.dirs.sort();
        level.dirs.dedup();
        level.more = None;
        Ok(level)
    }
}
