//! A loose dataset directory served in place: the tree is walked once at mount (as `pack` walks
//! it: depth first, names sorted by bytes, symbolic links and special files left out with the
//! reason), and becomes the same catalog a pack has — an index held in memory whose records
//! address a [`FileSet`], the directory's files laid out one after the other in that order at
//! page-aligned offsets. Read-ahead, warm, pin, decoded views, drop-cache and stats are the
//! pack's, unchanged; the kernel may read the files themselves (FUSE passthrough, see
//! [`crate::fuse`]).
//!
//! Samples carry no CRC-32: the files are the originals, there is no other copy to check them
//! against. What the mount guards against instead is a file changing under it: every use of a
//! file checks its inode, size and modification time against the walk's, and a file changed,
//! replaced or removed since the mount answers EIO naming it (never its old bytes mixed with
//! new ones). While mounted, a watcher (`crate::fs::watch`) notices changes and `crate::fs::changes` serves each
//! name that changed as the disk has it now.

use crate::catalog::ObjectInfo;
use crate::catalog::native::NativeCatalog;
use crate::pack::index::{self, Node};
use crate::pack::writer::record_for;
use crate::source::{ItemKind, Skipped, Source};
use crate::storage::files::{FileSet, SetFile, Stamp};
use crate::view::Views;
use anyhow::{Context, Result};
use memmap2::Mmap;
use rayon::prelude::*;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes of a file read for its JPEG header when views are asked for (a header behind more
/// metadata than this is read up to 4 MiB): 8 KiB holds the frame header of the ImageNet
/// JPEGs, and reading 64 KiB read most of each file (the mount of the 30k bench set left
/// 1.15 GB of it cached).
const HEAD: usize = 8 << 10;
/// The most read of a file for its JPEG header, bytes.
const HEAD_MAX: u64 = 4 << 20;

/// A walked directory: its catalog's index and its files.
#[derive(Debug)]
pub struct LooseDir {
    /// The directory, canonical.
    pub root: PathBuf,
    /// Entries left out, each with the reason.
    pub skipped: Skipped,
    files: Arc<FileSet>,
    index: Arc<Mmap>,
}

/// Width, height and components of the JPEG `path` (`len` bytes), if it is one.
fn probe_file(path: &Path, len: u64) -> Option<crate::pack::jpeg::JpegInfo> {
    let f = crate::storage::files::open_original(path).ok()?;
    // Only the head: the kernel's read-ahead would read the whole of most files.
    let _ = nix::fcntl::posix_fadvise(&f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM);
    let mut head = vec![0u8; (len as usize).min(HEAD)];
    f.read_exact_at(&mut head, 0).ok()?;
    let info = crate::pack::jpeg::probe(&head);
    if info.is_some() || len <= HEAD as u64 || !head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return info;
    }
    let mut head = vec![0u8; len.min(HEAD_MAX) as usize];
    f.read_exact_at(&mut head, 0).ok()?;
    crate::pack::jpeg::probe(&head)
}

impl LooseDir {
    /// Walks directory `src`; with `views`, reads every file's JPEG header too (in parallel)
    /// so decoded views have sizes. `progress` counts the files walked, then probed.
    /// Errors: `src` unreadable, an entry that cannot be read, a name reserved for the
    /// control directory at the top.
    pub fn open(src: &Path, views: bool, progress: crate::progress::Progress) -> Result<LooseDir> {
        let root = std::fs::canonicalize(src)
            .with_context(|| format!("cannot read directory {}", src.display()))?;
        let source = Source::open(&root, Path::new(""), false, progress)?;
        let mut nodes = Vec::with_capacity(source.items.len() + 1);
        nodes.push(Node {
            parent: None,
            name: Vec::new(),
            record: record_for(source.root, true),
        });
        let mut files = Vec::new();
        let mut at = 0u64;
        for item in &source.items {
            let mut r = record_for(item.meta, matches!(item.kind, ItemKind::Dir));
            if let ItemKind::File { size, .. } = item.kind {
                let m = std::fs::symlink_metadata(&item.path)
                    .with_context(|| format!("cannot stat {}", item.path.display()))?;
                let rel = item.path.strip_prefix(&root).unwrap_or(&item.path);
                let stamp = Stamp {
                    len: size,
                    ..Stamp::of(&m)
                };
                r.data_off = at;
                r.size = size;
                files.push((
                    nodes.len(),
                    SetFile {
                        rel: rel.to_path_buf(),
                        base: at,
                        stamp,
                    },
                ));
                at = (at + size).next_multiple_of(4096);
            }
            nodes.push(Node {
                parent: Some(item.parent.map_or(0, |p| p + 1)),
                name: item.name.as_bytes().to_vec(),
                record: r,
            });
        }
        if views {
            let probed = progress.meter(
                "probe",
                crate::progress::Unit::Files,
                Some(files.len() as u64),
            );
            let found: Vec<_> = files
                .par_iter()
                .map(|(_, f)| {
                    probed.inc(1);
                    probe_file(&root.join(&f.rel), f.stamp.len)
                })
                .collect();
            for ((n, _), info) in files.iter().zip(found) {
                if let Some(j) = info {
                    let r = &mut nodes[*n].record;
                    (r.width, r.height, r.components) = (j.width, j.height, j.components);
                }
            }
        }
        let bytes_index = index::build(&nodes, 4096)
            .with_context(|| format!("cannot index {}", root.display()))?;
        let mut map = memmap2::MmapMut::map_anon(bytes_index.len())?;
        map.copy_from_slice(&bytes_index);
        let files = FileSet::new(&root, files.into_iter().map(|(_, f)| f).collect())?;
        Ok(LooseDir {
            root,
            skipped: source.skipped,
            files: Arc::new(files),
            index: Arc::new(map.make_read_only()?),
        })
    }

    /// The catalog of the tree, showing `views` of its JPEGs (those probed at the walk).
    /// Errors: the index does not validate (a bug, reported as such).
    pub fn catalog(&self, views: Views) -> Result<NativeCatalog> {
        let len = crate::storage::Storage::len(&*self.files, 0);
        // Read-ahead and warm stop at the last file's last byte, not at its page's end.
        let data_end = (self.files.files().iter())
            .map(|f| f.base + f.stamp.len)
            .max()
            .unwrap_or(0);
        let obj = ObjectInfo {
            path: self.root.clone(),
            len,
            data_end,
            align: 4096,
        };
        let cat = NativeCatalog::with_objects(
            self.index.clone(),
            0..self.index.len(),
            vec![obj],
            vec![0],
            views,
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", self.root.display()))?;
        Ok(cat.without_checksums())
    }

    /// What the directory is, for serving it with `views`: its catalog and files, and
    /// where they are (frames and the live changes that answer names changed while mounted
    /// are composed over them, `crate::mount::compose`); the owner is the directory's.
    /// Errors: those of [`LooseDir::catalog`], or the directory's metadata cannot be read.
    pub fn opened(&self, views: Views) -> Result<super::Opened> {
        Ok(super::Opened {
            catalog: Arc::new(self.catalog(views)?),
            storage: self.storage(),
            owner: super::metadata(&self.root)?,
            lease: None,
            files: super::Files::Dir {
                root: self.root.clone(),
                raw: Arc::new(self.catalog(Views::default())?),
                files: self.storage(),
            },
        })
    }

    /// The files, as one storage object.
    pub fn storage(&self) -> Arc<FileSet> {
        self.files.clone()
    }

    /// Bytes of every file.
    pub fn bytes(&self) -> u64 {
        self.files.files().iter().map(|f| f.stamp.len).sum()
    }

    /// The index's totals (files, directories, bytes, JPEGs probed).
    pub fn totals(&self) -> crate::pack::index::Totals {
        crate::pack::index::IndexView::parse(&self.index[..])
            .map(|v| v.totals())
            .unwrap_or_default()
    }

    /// Number of files.
    pub fn files(&self) -> usize {
        self.files.files().len()
    }
}
