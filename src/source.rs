//! Sources for `loosefs pack`: a directory tree, or a foreign zip archive to convert. Either
//! becomes a list of [`Item`]s in pack order (depth first, names sorted by bytes: the order
//! ImageFolder and DALI iterate) plus the entries left out, each with the reason.
//!
//! Zip member names are taken only through the zip crate's `enclosed_name`: a name that is
//! absolute or climbs out with `..` refuses the whole archive, naming the member.

use crate::format::writer::EntryMeta;
use crate::options::SourceArgs;
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
struct Loc {
    obj: u32,
    off: u64,
    len: u64,
    crc: Option<u32>,
    header: Vec<u8>,
}

impl Source {
    /// Walks `src`: a directory, or a zip archive (any file that is not a directory). `out` is
    /// left out if it lies inside `src`.
    ///
    /// Errors: `src` missing or unreadable; an unreadable entry; a zip that does not parse, has
    /// a member name escaping the tree, or names one path twice.
    pub fn open(src: &Path, out: &Path, follow_links: bool) -> Result<Source> {
        Source::open_with(src, out, follow_links, &SourceArgs::default())
    }

    /// [`Source::open`], reading sources in other packed formats too: with `--format`, a
    /// directory that is a dataset of a known format (an MDS/LitData `index.json`, GulpIO
    /// `.gmeta` files, or only `.tar`/TFRecord files and no subdirectory), or a file that is
    /// neither a directory nor a zip archive. Errors: as [`Source::open`], and those of
    /// [`crate::dataset::Dataset::open`].
    pub fn open_with(
        src: &Path,
        out: &Path,
        follow_links: bool,
        args: &SourceArgs,
    ) -> Result<Source> {
        if src.to_str().is_some_and(crate::storage::object::is_url) {
            return walk_foreign(src, args);
        }
        let meta = std::fs::metadata(src)
            .with_context(|| format!("cannot read source {}", src.display()))?;
        let is_zip = meta.is_file()
            && crate::formats::read_at(src, 0, 4)
                .is_ok_and(|h| h == b"PK\x03\x04" || h == b"PK\x05\x06");
        let foreign = args.format.is_some()
            || (meta.is_dir() && foreign_dir(src))
            || (meta.is_file() && !is_zip);
        let source = if foreign {
            walk_foreign(src, args)?
        } else if meta.is_dir() {
            walk_dir(src, out, follow_links)?
        } else if meta.is_file() {
            walk_zip(src, &meta)?
        } else {
            bail!(
                "source {} is not a directory or a zip archive",
                src.display()
            )
        };
        if let Some(i) = source
            .items
            .iter()
            .find(|i| i.parent.is_none() && i.name == RESERVED_ROOT_NAME)
        {
            bail!(
                "{}: the name `{RESERVED_ROOT_NAME}` at the top of a pack is reserved for the mount's control \
                 directory; rename it, or move it one level down",
                i.path.display()
            );
        }
        Ok(source)
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
                bail!(
                    "{}: {} changed since it was indexed (CRC-32 mismatch at byte {off} of {})",
                    item.path.display(),
                    item.name,
                    path.display()
                );
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
fn walk_dir(src: &Path, out: &Path, follow_links: bool) -> Result<Source> {
    let root_meta = std::fs::metadata(src)
        .with_context(|| format!("cannot read source directory {}", src.display()))?;
    if !root_meta.is_dir() {
        bail!("source {} is not a directory", src.display());
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
    use crate::formats::Format;
    match crate::formats::detect(src) {
        Ok(Format::Mds | Format::Litdata | Format::Gulpio) => true,
        Ok(_) => std::fs::read_dir(src).is_ok_and(|rd| {
            rd.filter_map(|e| e.ok())
                .all(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        }),
        // Damaged, but meant as a dataset (its index, or shard files only): packed as a plain
        // tree it would hold the raw shards, so it is opened as a dataset and refused with why.
        Err(_) => crate::formats::looks_like_dataset(src),
    }
}

/// The tree a mount of foreign source `src` shows, as items in pack order.
fn walk_foreign(src: &Path, args: &SourceArgs) -> Result<Source> {
    let (f, storage): (_, std::sync::Arc<dyn crate::storage::Storage>) =
        match crate::dataset::Dataset::open(src, args, true)? {
            crate::dataset::Dataset::Foreign(f) => {
                let storage = crate::dataset::storage_of(&f, args.chunk_cache.max(64 << 20))
                    .with_context(|| format!("cannot open the files of {}", src.display()))?;
                (f, storage)
            }
            crate::dataset::Dataset::RemoteSet(r) => {
                let storage = r.storage(args.chunk_cache.max(64 << 20));
                (r.foreign, storage)
            }
            crate::dataset::Dataset::Pack(_) => unreachable!("open_with sends packs to walk_zip"),
            crate::dataset::Dataset::Remote(_) => {
                bail!("{}: a loosefs pack already; nothing to pack", src.display())
            }
            crate::dataset::Dataset::Dir(_) => {
                unreachable!("open_with sends plain directories to walk_dir")
            }
        };
    let ix = f.view();
    let paths = f.header.objects.iter().map(|o| o.path.clone()).collect();
    let bases = &f.header.bases;
    let meta_of = |r: &crate::format::index::Record| EntryMeta {
        mode: if r.is_dir {
            libc::S_IFDIR | 0o755
        } else {
            libc::S_IFREG | 0o644
        },
        mtime_sec: r.mtime_sec,
        mtime_nsec: r.mtime_nsec,
    };
    let root_rec = ix.record(0).context("empty index")?;
    let mut items = Vec::new();
    let mut locs = Vec::new();
    // Depth first, children in name order (the order the index keeps them in).
    let mut stack: Vec<(u32, Option<usize>, PathBuf)> = ix
        .children(&root_rec)
        .rev()
        .map(|c| (c, None, src.to_path_buf()))
        .collect();
    while let Some((i, parent, dir)) = stack.pop() {
        let r = ix.record(i).context("index record")?;
        let name = String::from_utf8_lossy(ix.name(&r)).into_owned();
        let path = dir.join(&name);
        let me = items.len();
        let kind = if r.is_dir {
            for c in ix.children(&r).rev() {
                stack.push((c, Some(me), path.clone()));
            }
            ItemKind::Dir
        } else {
            let k = bases.partition_point(|&b| b <= r.data_off) - 1;
            let pixels = r.is_pixels();
            let header = if pixels {
                crate::view::ViewGeom {
                    kind: crate::view::ViewKind::Ppm,
                    width: r.width,
                    height: r.height,
                    denom: 1,
                }
                .header()
            } else {
                Vec::new()
            };
            let size = r.size + header.len() as u64;
            locs.push(Loc {
                obj: k as u32,
                off: r.data_off - bases[k],
                len: r.size,
                crc: r.crc(),
                header,
            });
            ItemKind::File {
                size,
                member: Some(locs.len() - 1),
            }
        };
        items.push(Item {
            path,
            parent,
            name,
            kind,
            meta: meta_of(&r),
        });
    }
    Ok(Source {
        root: meta_of(&root_rec),
        items,
        skipped: Skipped::new(),
        zip: None,
        stored: Some(Stored {
            storage,
            paths,
            locs,
        }),
    })
}
