//! Sources for `loosefs pack`: a directory tree, or a foreign zip archive to convert. Either
//! becomes a list of [`Item`]s in pack order (depth first, names sorted by bytes: the order
//! ImageFolder and DALI iterate) plus the entries left out, each with the reason.
//!
//! Zip member names are taken only through the zip crate's `enclosed_name`: a name that is
//! absolute or climbs out with `..` refuses the whole archive, naming the member.

use crate::pack::writer::EntryMeta;
use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use std::io::{Cursor, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[cfg(test)]
mod tests;
mod zip_source;
use zip_source::walk_zip;

/// Kind of an item; files know their size and, in a zip source, their member number.
#[derive(Debug, Clone, Copy)]
pub enum ItemKind {
    /// A directory.
    Dir,
    /// A regular file.
    File {
        /// Its length, bytes.
        size: u64,
        /// Its member number in a zip source; `None` in a directory.
        member: Option<usize>,
    },
}

/// A name no entry at the top of a pack may have: mounts show their control directory there.
pub const RESERVED_ROOT_NAME: &str = ".loosefs";

/// One directory or file to pack.
#[derive(Debug, Clone)]
pub struct Item {
    /// Where it comes from, for messages (a path, or `archive.zip:member/name`).
    pub path: PathBuf,
    /// Index of the parent directory in the item list; `None` for children of the root.
    pub parent: Option<usize>,
    /// File name (UTF-8).
    pub name: String,
    /// Directory or file (with its size).
    pub kind: ItemKind,
    /// Mode and modification time packed with it.
    pub meta: EntryMeta,
}

/// Entries left out of a pack, each with the reason.
pub type Skipped = Vec<(PathBuf, String)>;

/// A walked source.
pub struct Source {
    /// Mode and mtime for the root directory.
    pub root: EntryMeta,
    /// What is packed, in pack order (parents before children).
    pub items: Vec<Item>,
    /// What is left out, each with the reason.
    pub skipped: Skipped,
    /// The parsed archive when the source is a zip file: clones share its central directory,
    /// so reading a member does not parse it again.
    zip: Option<zip::ZipArchive<Cursor<MapBytes>>>,
    /// The dataset's files when the source is in another packed format: a file item's
    /// `member` indexes `locs`.
    stored: Option<Stored>,
}

/// A shared mapping as the bytes a zip reader reads.
#[derive(Clone)]
struct MapBytes(std::sync::Arc<Mmap>);

impl AsRef<[u8]> for MapBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0[..]
    }
}

/// Where the files of a foreign source's samples are: the open objects, and per sample
/// where its stored bytes are.
struct Stored {
    storage: std::sync::Arc<dyn crate::storage::Storage>,
    paths: Vec<PathBuf>,
    locs: Vec<Loc>,
}

/// One sample of a foreign source: its object, the offset and length of its stored bytes, the
/// CRC-32 the index recorded for them (`None`: indexed with `--verify lazy` from a format
/// without checksums; the pack's own CRC-32 is computed as the bytes are copied), and the header the mount shows before them (raw RGB
/// pixels are a PPM file on the mount, so they are one in the pack too).
pub(crate) struct Loc {
    pub(crate) obj: u32,
    pub(crate) off: u64,
    pub(crate) len: u64,
    pub(crate) crc: Option<u32>,
    pub(crate) header: Vec<u8>,
}

impl Source {
    /// Walks `src`: a directory, or a zip archive (any file that is not a directory). `out` is
    /// left out if it lies inside `src`.
    ///
    /// Errors: `src` missing or unreadable; an unreadable entry; a zip that does not parse, has
    /// a member name escaping the tree, or names one path twice.
    pub fn open(
        src: &Path,
        out: &Path,
        follow_links: bool,
        progress: crate::progress::Progress,
    ) -> Result<Source> {
        let meta = std::fs::metadata(src)
            .with_context(|| format!("cannot read source {}", src.display()))?;
        let source = if meta.is_dir() {
            walk_dir(src, out, follow_links, progress)?
        } else if meta.is_file() {
            walk_zip(src, &meta).map_err(|e| crate::exit_code::as_damaged(e, src))?
        } else {
            return Err(crate::exit_code::refuse(
                crate::exit_code::ExitKind::Usage,
                format!(
                    "source {} is not a directory or a zip archive",
                    src.display()
                ),
            ));
        };
        source.check_reserved()?;
        Ok(source)
    }

    /// Whether `src` is packed as a dataset of another format rather than walked here: a URL,
    /// any source with `--format`, a directory that is a dataset of a known format (an
    /// MDS/LitData `index.json`, GulpIO `.gmeta` files, or only `.tar`/TFRecord files and no
    /// subdirectory), or a file that is neither a directory nor a zip archive (the packer
    /// opens those as datasets). Errors: `src` missing or unreadable.
    pub fn is_foreign(src: &Path, format: Option<crate::formats::Format>) -> Result<bool> {
        if src.to_str().is_some_and(crate::storage::object::is_url) {
            return Ok(true);
        }
        let meta = std::fs::metadata(src)
            .with_context(|| format!("cannot read source {}", src.display()))?;
        let is_zip = meta.is_file()
            && crate::formats::read_at(src, 0, 4)
                .is_ok_and(|h| h == b"PK\x03\x04" || h == b"PK\x05\x06");
        Ok(format.is_some() || (meta.is_dir() && foreign_dir(src)) || (meta.is_file() && !is_zip))
    }

    /// A walked dataset of another format: its `root`, its `items` in pack order, and where
    /// each file's stored bytes are (`locs[member]` in `storage`'s objects, named `paths`).
    pub(crate) fn from_stored(
        root: EntryMeta,
        items: Vec<Item>,
        storage: std::sync::Arc<dyn crate::storage::Storage>,
        paths: Vec<PathBuf>,
        locs: Vec<Loc>,
    ) -> Source {
        Source {
            root,
            items,
            skipped: Skipped::new(),
            zip: None,
            stored: Some(Stored {
                storage,
                paths,
                locs,
            }),
        }
    }

    /// Refuses a source with [`RESERVED_ROOT_NAME`] at its top, naming it.
    pub fn check_reserved(&self) -> Result<()> {
        if let Some(i) =
            (self.items.iter()).find(|i| i.parent.is_none() && i.name == RESERVED_ROOT_NAME)
        {
            bail!(
                "{}: the name `{RESERVED_ROOT_NAME}` at the top of a pack is reserved for the mount's control \
                 directory; rename it, or move it one level down",
                i.path.display()
            );
        }
        Ok(())
    }

    /// Calls `f` with a reader of the bytes of file item `item` (for files too large to read
    /// whole). Errors: the file cannot be opened, or `f`'s error.
    pub fn with_reader<T>(
        &self,
        item: &Item,
        f: impl FnOnce(&mut dyn Read) -> Result<T>,
    ) -> Result<T> {
        if self.stored.is_some() {
            let data = self.read(item)?;
            return f(&mut Cursor::new(data));
        }
        match (item.kind, &self.zip) {
            (
                ItemKind::File {
                    member: Some(k), ..
                },
                Some(z),
            ) => {
                let mut z = z.clone();
                let mut m = z.by_index(k)?;
                f(&mut m)
            }
            _ => {
                let mut file = std::fs::File::open(&item.path)
                    .with_context(|| format!("cannot read {}", item.path.display()))?;
                f(&mut file)
            }
        }
    }

    /// Reads the bytes of file item `item`.
    pub fn read(&self, item: &Item) -> Result<Vec<u8>> {
        if let (
            Some(st),
            ItemKind::File {
                member: Some(k), ..
            },
        ) = (&self.stored, item.kind)
        {
            let Loc {
                obj,
                off,
                len,
                crc,
                ref header,
            } = st.locs[k];
            let path = &st.paths[obj as usize];
            let mut data = header.clone();
            let h = data.len();
            data.resize(h + len as usize, 0);
            st.storage
                .read_at(obj, off, &mut data[h..])
                .with_context(|| format!("cannot read {} at byte {off}", path.display()))?;
            if crc.is_some_and(|c| crc32fast::hash(&data[h..]) != c) {
                // Its bytes fail the checksum the index holds: damaged (or changed) data.
                return Err(crate::exit_code::refuse(
                    crate::exit_code::ExitKind::Damaged,
                    format!(
                        "{}: {} changed since it was indexed (CRC-32 mismatch at byte {off} of {})",
                        item.path.display(),
                        item.name,
                        path.display()
                    ),
                ));
            }
            return Ok(data);
        }
        match (item.kind, &self.zip) {
            (
                ItemKind::File {
                    member: Some(k),
                    size,
                },
                Some(z),
            ) => {
                let mut z = z.clone();
                let mut f = z.by_index(k)?;
                // The size is the archive's claim: grown as the member's bytes prove it.
                let mut data = Vec::with_capacity(size.min(16 << 20) as usize);
                (&mut f)
                    .take(size.saturating_add(1))
                    .read_to_end(&mut data)
                    .with_context(|| format!("cannot read {}", item.path.display()))?;
                if data.len() as u64 != size {
                    bail!(
                        "{}: the archive says {size} bytes, the member holds {}",
                        item.path.display(),
                        data.len()
                    );
                }
                Ok(data)
            }
            _ => std::fs::read(&item.path)
                .with_context(|| format!("cannot read {}", item.path.display())),
        }
    }
}

fn entry_meta(m: &std::fs::Metadata) -> EntryMeta {
    EntryMeta {
        mode: m.mode(),
        mtime_sec: m.mtime(),
        mtime_nsec: m.mtime_nsec() as u32,
    }
}

/// Walks `src`, returning the items in pack order (depth first, names sorted by bytes) and the
/// skipped entries.
fn walk_dir(
    src: &Path,
    out: &Path,
    follow_links: bool,
    progress: crate::progress::Progress,
) -> Result<Source> {
    let root_meta = std::fs::metadata(src)
        .with_context(|| format!("cannot read source directory {}", src.display()))?;
    if !root_meta.is_dir() {
        return Err(crate::exit_code::refuse(
            crate::exit_code::ExitKind::Usage,
            format!("source {} is not a directory", src.display()),
        ));
    }
    let out_abs = std::path::absolute(out).unwrap_or_else(|_| out.to_path_buf());
    let mut items: Vec<Item> = Vec::new();
    let mut skipped = Vec::new();
    // stack[d] = item index of the directory at depth d + 1 currently open.
    let mut stack: Vec<usize> = Vec::new();
    let mut it = walkdir::WalkDir::new(src)
        .follow_links(follow_links)
        .min_depth(1)
        .sort_by(|a, b| a.file_name().cmp(b.file_name()))
        .into_iter();
    // A spinner counting the files found: a tree of millions takes minutes to walk.
    let walked = progress.meter("walk", crate::progress::Unit::Files, None);
    while let Some(entry) = it.next() {
        let entry = entry.map_err(|e| {
            let p = e
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            anyhow::anyhow!("cannot read {p}: {e}")
        })?;
        let path = entry.path().to_path_buf();
        stack.truncate(entry.depth() - 1);
        let parent = stack.last().copied();
        let ft = entry.file_type();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            if ft.is_dir() {
                it.skip_current_dir();
            }
            skipped.push((
                path,
                "file name is not UTF-8 (zip member names must be)".into(),
            ));
            continue;
        };
        if std::path::absolute(&path).is_ok_and(|p| p == out_abs) {
            skipped.push((path, "this is the output pack itself".into()));
            continue;
        }
        let meta = entry
            .metadata()
            .with_context(|| format!("cannot stat {}", path.display()))?;
        if ft.is_dir() {
            stack.push(items.len());
            items.push(Item {
                path,
                parent,
                name,
                kind: ItemKind::Dir,
                meta: entry_meta(&meta),
            });
        } else if ft.is_file() {
            walked.inc(1);
            items.push(Item {
                path,
                parent,
                name,
                kind: ItemKind::File {
                    size: meta.len(),
                    member: None,
                },
                meta: entry_meta(&meta),
            });
        } else if ft.is_symlink() {
            skipped.push((path, "symbolic link (use --follow-links to follow)".into()));
        } else {
            skipped.push((path, "special file (device, FIFO or socket)".into()));
        }
    }
    Ok(Source {
        root: entry_meta(&root_meta),
        items,
        skipped,
        zip: None,
        stored: None,
    })
}

/// True when directory `src` is a dataset in another packed format rather than a tree to
/// pack as is: an MDS/LitData `index.json`, GulpIO `.gmeta` files, or only `.tar`/TFRecord
/// files and no subdirectory.
pub(crate) fn foreign_dir(src: &Path) -> bool {
    match crate::formats::detect(src) {
        Ok(f) if f.is_directory_dataset() => true,
        Ok(_) => std::fs::read_dir(src).is_ok_and(|rd| {
            rd.filter_map(|e| e.ok())
                .all(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        }),
        // Damaged, but meant as a dataset (its index, or shard files only): packed as a plain
        // tree it would hold the raw shards, so it is opened as a dataset and refused with why.
        Err(_) => crate::formats::looks_like_dataset(src),
    }
}
