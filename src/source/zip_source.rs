//! A zip archive as a `pack` source: its central directory read once, member names checked
//! (nothing escapes the tree, no name twice), the tree and its metadata rebuilt.

use super::{Item, ItemKind, MapBytes, Skipped, Source};
use crate::formats::zip::{member_parts, refuse_merged_duplicates};
use crate::pack::writer::EntryMeta;
use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::io::Cursor;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Every entry's components -> (member index, is a directory, metadata); implicit parent
/// directories included.
type Tree = BTreeMap<Vec<String>, (Option<usize>, bool, EntryMeta)>;

/// The archive handle `walk_zip` reads members through.
type Archive<'a> = zip::ZipArchive<Cursor<&'a [u8]>>;

/// The metadata a member is packed with: its Unix permissions (0755/0644 when it has none)
/// and its modification time (`default_mtime`, the archive's, when it has none).
fn entry_meta(f: &zip::read::ZipFile<'_, Cursor<&[u8]>>, default_mtime: i64) -> EntryMeta {
    let mode = f.unix_mode().unwrap_or(0);
    let is_dir = f.is_dir();
    let perm = match (mode & 0o7777, is_dir) {
        (0, true) => 0o755,
        (0, false) => 0o644,
        (p, _) => p,
    };
    let mtime = f
        .last_modified()
        .and_then(|t| time::PrimitiveDateTime::try_from(t).ok())
        .map_or(default_mtime, |t| t.assume_utc().unix_timestamp());
    EntryMeta {
        mode: perm | if is_dir { libc::S_IFDIR } else { libc::S_IFREG },
        mtime_sec: mtime,
        mtime_nsec: 0,
    }
}

/// The tree of archive `z` (of `src`): names checked and resolved, symbolic links skipped.
/// Errors: a name that escapes or names nothing, a name twice.
fn tree_of(src: &Path, z: &mut Archive, default_mtime: i64) -> Result<(Tree, Skipped)> {
    let mut tree = Tree::new();
    let mut skipped = Skipped::new();
    for k in 0..z.len() {
        let f = z.by_index_raw(k)?;
        let parts = member_parts(src, &f)?;
        let is_dir = f.is_dir();
        if parts.is_empty() {
            continue; // a `./` entry: the root itself
        }
        if f.unix_mode().unwrap_or(0) & libc::S_IFMT == libc::S_IFLNK {
            skipped.push((src.join(f.name()), "symbolic link in the archive".into()));
            continue;
        }
        let meta = entry_meta(&f, default_mtime);
        for d in 1..parts.len() {
            let implied = EntryMeta {
                mode: libc::S_IFDIR | 0o755,
                ..meta
            };
            tree.entry(parts[..d].to_vec())
                .or_insert((None, true, implied));
        }
        match tree.get_mut(&parts) {
            Some(e) if !is_dir || !e.1 => bail!(
                "{}: {:?} appears twice in the archive",
                src.display(),
                f.name()
            ),
            Some(e) => e.2 = meta, // explicit entry for an implied directory
            None => {
                tree.insert(parts, ((!is_dir).then_some(k), is_dir, meta));
            }
        }
    }
    Ok((tree, skipped))
}

/// The source items of `tree`, parents before children. Errors: a name that is both a file
/// and a directory.
fn items_of(src: &Path, tree: &Tree, z: &mut Archive) -> Result<Vec<Item>> {
    let mut items: Vec<Item> = Vec::with_capacity(tree.len());
    let mut index_of: BTreeMap<&[String], usize> = BTreeMap::new();
    for (parts, (member, _, meta)) in tree {
        let parent = match parts.len() {
            1 => None,
            n => Some(
                *index_of
                    .get(&parts[..n - 1])
                    .context("zip entry without its parent directory")?,
            ),
        };
        if parent.is_some_and(|p| !matches!(items[p].kind, ItemKind::Dir)) {
            bail!(
                "{}: {:?} is both a file and a directory",
                src.display(),
                parts.join("/")
            );
        }
        let kind = match member {
            Some(k) => ItemKind::File {
                size: z.by_index_raw(*k)?.size(),
                member: Some(*k),
            },
            None => ItemKind::Dir,
        };
        index_of.insert(parts, items.len());
        items.push(Item {
            path: src.join(parts.join("/")),
            parent,
            name: parts[parts.len() - 1].clone(),
            kind,
            meta: *meta,
        });
    }
    Ok(items)
}

/// A zip archive `src` (metadata `meta`) as a pack source.
pub(super) fn walk_zip(src: &Path, meta: &std::fs::Metadata) -> Result<Source> {
    let file =
        std::fs::File::open(src).with_context(|| format!("cannot open {}", src.display()))?;
    // SAFETY: read-only map of the source archive; it must not be truncated while packing.
    let map =
        unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", src.display()))?;
    let mut z = zip::ZipArchive::new(Cursor::new(&map[..])).with_context(|| {
        format!(
            "{} is not a directory or a readable zip archive",
            src.display()
        )
    })?;
    let root = EntryMeta {
        mode: 0o40755,
        mtime_sec: meta.mtime(),
        mtime_nsec: meta.mtime_nsec() as u32,
    };
    refuse_merged_duplicates(src, &map, &mut z)?;
    let (tree, skipped) = tree_of(src, &mut z, meta.mtime())?;
    let items = items_of(src, &tree, &mut z)?;
    drop(z);
    let map = std::sync::Arc::new(map);
    let archive = zip::ZipArchive::new(Cursor::new(MapBytes(map)))?;
    Ok(Source {
        root,
        items,
        skipped,
        zip: Some(archive),
        stored: None,
    })
}
