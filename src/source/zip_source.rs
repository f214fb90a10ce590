//! A zip archive as a `pack` source: its central directory read once, member names checked
//! (nothing escapes the tree, no name twice), the tree and its metadata rebuilt.

use super::{Item, ItemKind, MapBytes, Skipped, Source};
use crate::format::writer::EntryMeta;
use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::io::Cursor;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

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
    let default_time = (meta.mtime(), meta.mtime_nsec() as u32);
    let root = EntryMeta {
        mode: 0o40755,
        mtime_sec: default_time.0,
        mtime_nsec: default_time.1,
    };
    // Components of every entry -> (member, is_dir, meta); implicit parent directories added.
    let mut tree: BTreeMap<Vec<String>, (Option<usize>, bool, EntryMeta)> = BTreeMap::new();
    let mut skipped = Skipped::new();
    refuse_merged_duplicates(src, &map, &mut z)?;
    for k in 0..z.len() {
        let f = z.by_index_raw(k)?;
        let shown = src.join(f.name());
        let parts = member_path(f.name_raw()).map_err(|why| {
            anyhow::anyhow!(
                "{}: member {:?} {why}; refusing the archive",
                src.display(),
                String::from_utf8_lossy(f.name_raw())
            )
        })?;
        if parts.is_empty() && !f.is_dir() {
            bail!(
                "{}: member {:?} names no file (empty, or only `.`); refusing the archive",
                src.display(),
                f.name()
            );
        }
        if parts.is_empty() {
            continue; // a `./` entry: the root itself
        }
        let mode = f.unix_mode().unwrap_or(0);
        if mode & libc::S_IFMT == libc::S_IFLNK {
            skipped.push((shown, "symbolic link in the archive".into()));
            continue;
        }
        let is_dir = f.is_dir();
        let perm = if mode & 0o7777 != 0 {
            mode & 0o7777
        } else if is_dir {
            0o755
        } else {
            0o644
        };
        let mtime = f
            .last_modified()
            .and_then(|t| time::PrimitiveDateTime::try_from(t).ok())
            .map_or(default_time.0, |t| t.assume_utc().unix_timestamp());
        let meta = EntryMeta {
            mode: perm | if is_dir { libc::S_IFDIR } else { libc::S_IFREG },
            mtime_sec: mtime,
            mtime_nsec: 0,
        };
        for d in 1..parts.len() {
            tree.entry(parts[..d].to_vec()).or_insert((
                None,
                true,
                EntryMeta {
                    mode: libc::S_IFDIR | 0o755,
                    ..meta
                },
            ));
        }
        let member = (!is_dir).then_some(k);
        match tree.get_mut(&parts) {
            Some(e) if !is_dir || !e.1 => bail!(
                "{}: {:?} appears twice in the archive",
                src.display(),
                f.name()
            ),
            Some(e) => e.2 = meta, // explicit entry for an implied directory
            None => {
                tree.insert(parts, (member, is_dir, meta));
            }
        }
    }
    let mut items = Vec::with_capacity(tree.len());
    let mut index_of: BTreeMap<&[String], usize> = BTreeMap::new();
    for (parts, (member, is_dir, meta)) in &tree {
        let parent = match parts.len() {
            1 => None,
            n => Some(
                *index_of
                    .get(&parts[..n - 1])
                    .context("zip entry without its parent directory")?,
            ),
        };
        if parent.is_some_and(|p| {
            !matches!(
                items[p],
                Item {
                    kind: ItemKind::Dir,
                    ..
                }
            )
        }) {
            bail!(
                "{}: {:?} is both a file and a directory",
                src.display(),
                parts.join("/")
            );
        }
        let size = match member {
            Some(k) => z.by_index_raw(*k)?.size(),
            None => 0,
        };
        index_of.insert(parts, items.len());
        items.push(Item {
            path: src.join(parts.join("/")),
            parent,
            name: parts[parts.len() - 1].clone(),
            kind: if *is_dir {
                ItemKind::Dir
            } else {
                ItemKind::File {
                    size,
                    member: *member,
                }
            },
            meta: *meta,
        });
    }
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

/// The components of zip member name `raw`, resolved lexically: `/`-separated, empty and `.`
/// components dropped, `..` removing the component before it. Errors (the reason): not UTF-8,
/// absolute, a NUL or backslash in it, or a `..` that would climb out of the archive's tree.
fn member_path(raw: &[u8]) -> Result<Vec<String>, String> {
    let name = std::str::from_utf8(raw).map_err(|_| "is not UTF-8".to_string())?;
    if name.starts_with('/') {
        return Err("is an absolute path (it would escape the extracted tree)".into());
    }
    if name.contains('\0') || name.contains('\\') {
        return Err("contains a NUL or a backslash".into());
    }
    let mut parts: Vec<String> = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err("would escape the extracted tree (`..` above its top)".into());
                }
            }
            c => parts.push(c.to_string()),
        }
    }
    Ok(parts)
}

/// Refuses an archive whose central directory names a member twice. The zip reader keeps one
/// entry per name, so a duplicate shows as a central-directory record no kept entry starts at:
/// the records of the kept entries must tile the central directory from its start, with no
/// record left after the last one.
fn refuse_merged_duplicates(
    src: &Path,
    map: &[u8],
    z: &mut zip::ZipArchive<Cursor<&[u8]>>,
) -> Result<()> {
    let mut starts = Vec::with_capacity(z.len());
    for k in 0..z.len() {
        starts.push(z.by_index_raw(k)?.central_header_start() as usize);
    }
    starts.sort_unstable();
    let record_end = |at: usize| -> Option<usize> {
        let h = map.get(at..at + 46)?;
        let len = |o: usize| usize::from(u16::from_le_bytes([h[o], h[o + 1]]));
        Some(at + 46 + len(28) + len(30) + len(32))
    };
    let name_at = |at: usize| -> String {
        let n = map
            .get(at + 28..at + 30)
            .map_or(0, |b| usize::from(u16::from_le_bytes([b[0], b[1]])));
        String::from_utf8_lossy(map.get(at + 46..at + 46 + n).unwrap_or(&[])).into_owned()
    };
    let mut expected = z.central_directory_start() as usize;
    for at in starts.iter().copied().chain(std::iter::once(usize::MAX)) {
        let dropped = if at == usize::MAX {
            map.get(expected..expected + 4) == Some(b"PK\x01\x02")
        } else {
            at != expected
        };
        if dropped {
            bail!(
                "{}: member {:?} appears twice in the archive; refusing it (which copy is meant?)",
                src.display(),
                name_at(expected)
            );
        }
        if at == usize::MAX {
            break;
        }
        expected = record_end(at).context("truncated central directory")?;
    }
    Ok(())
}
