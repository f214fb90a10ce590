//! Shared indexes: one index of a foreign dataset for every node that mounts it. `loosefs
//! index SRC` writes the index beside the dataset (`<SRC>.loosefs-index`, or `--out`) with
//! the dataset's files named relative to its root and keyed by their size and mtime (ns); a
//! mount finds it there (or takes `--index PATH`) and, when its options fit, uses it without
//! scanning or reading the dataset. A file that changed since makes the index stale: the mount
//! is refused, naming the file, until `loosefs index` is run again.

use super::{Foreign, Header, ObjectEntry, file, object_entry};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// Suffix of the default shared index beside a dataset.
pub const SUFFIX: &str = ".loosefs-index";

/// Where a shared index of `src` is looked for when none is named: `<src>.loosefs-index`
/// beside the dataset (a directory, a file, or a brace pattern of shards).
pub fn default_path(src: &Path) -> PathBuf {
    let mut s = src.as_os_str().to_os_string();
    s.push(SUFFIX);
    PathBuf::from(s)
}

/// The directory the dataset's files are named from: `src` itself when it is a directory,
/// else its parent (a single file, a brace pattern).
fn root_of(src: &Path) -> PathBuf {
    if src.is_dir() {
        src.to_path_buf()
    } else {
        src.parent().map_or_else(PathBuf::new, Path::to_path_buf)
    }
}

/// Writes `f` (the index of `src`) as a shared index at `dest`: the dataset's files named
/// relative to its root, the options and every file's size and mtime kept. Written to a
/// temporary file and renamed. Errors: a file of the index lies outside the dataset (a `.tar`
/// inflated from a `.tar.gz` in the local index directory: not shareable), or `dest` cannot be
/// written.
pub fn write(f: &Foreign, src: &Path, dest: &Path) -> Result<()> {
    let root = root_of(src);
    let relative = |o: &ObjectEntry| -> Result<ObjectEntry> {
        if o.derived_from.is_some() {
            bail!(
                "cannot share the index of {}: {} is made from {} on each node (inflated); \
                 mount it with its local index",
                src.display(),
                o.path.display(),
                o.derived_from
                    .as_ref()
                    .map_or(Path::new(""), |d| &d.path)
                    .display()
            );
        }
        let rel = o.path.strip_prefix(&root).with_context(|| {
            format!(
                "cannot share the index of {}: {} lies outside {}",
                src.display(),
                o.path.display(),
                root.display()
            )
        })?;
        Ok(ObjectEntry {
            path: rel.to_path_buf(),
            ..o.clone()
        })
    };
    let header = Header {
        objects: f
            .header
            .objects
            .iter()
            .map(relative)
            .collect::<Result<_>>()?,
        relative: true,
        ..f.header.clone()
    };
    file::write(dest, &header, &f.map[f.index.clone()])?;
    // Every node (and user) that reads the dataset reads its index.
    std::fs::set_permissions(dest, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .with_context(|| format!("cannot make {} readable", dest.display()))
}

/// Writes `f` (the index of the remote dataset at `url`) as a shared index at the local path
/// `dest`: object k named `names[k]` (relative to the dataset's URL), every object of the
/// dataset recorded with its pin (`remote`). Written to a temporary file and renamed.
pub fn write_remote(
    f: &Foreign,
    url: &str,
    names: &[String],
    remote: Vec<super::RemoteEntry>,
    dest: &Path,
) -> Result<()> {
    let header = Header {
        objects: (f.header.objects.iter().zip(names))
            .map(|(o, n)| ObjectEntry {
                path: PathBuf::from(n),
                mtime_ns: 0,
                ..o.clone()
            })
            .collect(),
        source: PathBuf::from(url),
        relative: true,
        remote,
        ..f.header.clone()
    };
    file::write(dest, &header, &f.map[f.index.clone()])?;
    std::fs::set_permissions(dest, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .with_context(|| format!("cannot make {} readable", dest.display()))
}

/// Loads the shared index at `path` for `src` if it was built with one of `options` (the
/// mount's, in order of preference): `Ok(None)` when it was built with others. Errors: not a
/// shared index, damaged, or stale (a file of the dataset missing or changed since: the
/// message names it and says how to rebuild).
pub fn load(path: &Path, src: &Path, options: &[String]) -> Result<Option<Foreign>> {
    let mut f = file::load(path)?;
    if !f.header.relative {
        bail!(
            "{} is not a shared index (write one with `loosefs index`)",
            path.display()
        );
    }
    if !options.contains(&f.header.options) {
        return Ok(None);
    }
    let root = root_of(src);
    for o in &mut f.header.objects {
        let rel = std::mem::take(&mut o.path);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| c == std::path::Component::ParentDir)
        {
            bail!(
                "{}: names {} outside the dataset",
                path.display(),
                rel.display()
            );
        }
        o.path = root.join(rel);
        let stale = |why: String| {
            crate::exit_code::refuse(
                crate::exit_code::ExitKind::Changed,
                format!(
                    "the shared index {} is stale: {} {why} since it was indexed; run `loosefs index {}` again",
                    path.display(),
                    o.path.display(),
                    src.display()
                ),
            )
        };
        let now = object_entry(&o.path).map_err(|e| stale(format!("cannot be read ({e:#})")))?;
        if now.len != o.len {
            return Err(stale(format!(
                "changed size ({} -> {} bytes)",
                o.len, now.len
            )));
        }
        if now.mtime_ns != o.mtime_ns {
            return Err(stale("was modified (another mtime)".into()));
        }
    }
    f.header.source = src.to_path_buf();
    Ok(Some(f))
}
