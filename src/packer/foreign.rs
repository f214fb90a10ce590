//! The packer's walk of a dataset in another packed format (WebDataset, MDS, LitData, FFCV,
//! ...; local or at a URL): the dataset is opened as a mount opens it, and its tree becomes the
//! pack's items, each file read from the dataset's own stored bytes (checked as a mount checks
//! them). The packer decides which sources take this way ([`Source::is_foreign`]).

use crate::open::Dataset;
use crate::open::OpenOptions;
use crate::open::foreign::storage_of;
use crate::pack::writer::EntryMeta;
use crate::progress::Progress;
use crate::source::{Item, ItemKind, Loc, Source};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// The tree a mount of foreign source `src` shows, as items in pack order, read from the
/// dataset's own files when packed.
///
/// Errors: those of [`Dataset::open`]; `src` a loosefs pack or a plain directory (nothing
/// foreign to convert).
pub(super) fn walk(src: &Path, args: &OpenOptions, progress: Progress) -> Result<Source> {
    let (f, storage): (_, std::sync::Arc<dyn crate::storage::Storage>) =
        match Dataset::open(src, args, progress)? {
            Dataset::Foreign(f) => {
                let storage = storage_of(&f, args.chunk_cache.max(64 << 20))
                    .with_context(|| format!("cannot open the files of {}", src.display()))?;
                (f, storage)
            }
            Dataset::RemoteSet(r) => {
                let storage = r.storage(args.chunk_cache.max(64 << 20));
                (r.foreign, storage)
            }
            Dataset::Pack(_) | Dataset::Remote(_) => {
                bail!("{}: a loosefs pack already; nothing to pack", src.display())
            }
            // Loose objects under a prefix: their tree, each file read from its object (pinned
            // to its listed ETag: the pin is the check, they carry no CRC-32 to compare).
            Dataset::RemoteDir(r) => {
                let paths = vec![PathBuf::from(r.url())];
                return tree(src, &r.view()?, &[0], paths, r.storage(), false);
            }
            Dataset::Dir(_) => {
                bail!(
                    "{}: a plain directory, not a dataset of another format",
                    src.display()
                )
            }
        };
    let paths = f.header.objects.iter().map(|o| o.path.clone()).collect();
    tree(src, &f.view(), &f.header.bases, paths, storage, true)
}

/// The tree of index `ix` as items in pack order, each file read from `storage`'s object
/// (`paths`, starting at `bases` in the records' `data_off` space), checked against its
/// recorded CRC-32 when `checked`.
fn tree(
    src: &Path,
    ix: &crate::pack::index::IndexView<'_>,
    bases: &[u64],
    paths: Vec<PathBuf>,
    storage: std::sync::Arc<dyn crate::storage::Storage>,
    checked: bool,
) -> Result<Source> {
    let meta_of = |r: &crate::pack::index::Record| EntryMeta {
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
                crc: r.crc().filter(|_| checked),
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
    Ok(Source::from_stored(
        meta_of(&root_rec),
        items,
        storage,
        paths,
        locs,
    ))
}
