//! What changed in a loose directory since its mount, and the files that changed, served.
//!
//! The catalog stays the mount's snapshot (its inodes, read-ahead, views, pins). A watcher
//! ([`super::watch`]) tells this module each name that changed in a directory; from then on
//! that name is answered from the disk: a file gone answers ENOENT, a file as the walk saw it
//! keeps its catalog inode, and anything else — a file added, a file replaced or rewritten, a
//! directory added — becomes a *late node*: an inode of its own (`ino::Node::Late`) bound to the
//! file's stamp (inode, size, mtime) at the moment it was looked up. A late file is read by the
//! daemon with a plain `pread` (no read-ahead, pin or decoded view until the next mount), its
//! stamp checked before and after every read, so a reader sees one version of a file or EIO,
//! never two versions mixed. A late directory is listed from the disk. A later change to the
//! same path makes a new late node; the old one answers EIO to those still holding it and is
//! dropped when the kernel forgets it.

use crate::catalog::{Attr, Catalog, FsError, Kind};
use crate::ino::Node;
use crate::storage::files::{FileSet, Stamp};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Counters of the changes noticed, for `stats` (each only grows but `late_nodes`).
#[derive(Debug, Default)]
pub struct ChangeStats {
    /// Directories watched for changes.
    pub watched: AtomicU64,
    /// Change events handled (a name created, removed, moved, written or touched).
    pub events: AtomicU64,
    /// Full comparisons of the tree against the snapshot (at start, after a lost event).
    pub rescans: AtomicU64,
    /// Late nodes held now (files and directories added or replaced since the mount).
    pub late_nodes: AtomicU64,
    /// Reads served from late files.
    pub late_reads: AtomicU64,
    /// Directories that could not be watched (their changes show at the next mount).
    pub unwatched: AtomicU64,
}

/// A file or directory added or replaced since the mount.
#[derive(Debug)]
struct Late {
    /// Path relative to the root.
    rel: PathBuf,
    /// What it was when looked up; reads check it.
    stamp: Stamp,
    attr: Attr,
    /// Inode of its directory (for `..`).
    parent: u64,
    /// Still what `rel` names (a later change made another node for it).
    current: bool,
    /// Its change was logged.
    reported: Arc<AtomicBool>,
}

#[derive(Debug, Default)]
struct ChangeSet {
    /// Names changed since the mount, per catalog directory inode.
    changed: HashMap<u64, HashSet<Vec<u8>>>,
    /// Late nodes by number.
    late: HashMap<u64, Late>,
    /// The current late node of each path.
    by_path: HashMap<PathBuf, u64>,
    /// Catalog directories' paths relative to the root, as the watcher found them.
    dirs: HashMap<u64, PathBuf>,
    next: u64,
}

/// The changes of one loose directory mount: see the module note.
pub struct Changes {
    root: PathBuf,
    /// The catalog as served (with its views; JPEGs hidden under `--decoded-only`).
    catalog: Arc<dyn Catalog>,
    /// The same index without views: every stored file under its own name, same inodes.
    raw: Arc<dyn Catalog>,
    files: Arc<FileSet>,
    /// Late files that are JPEGs are not shown (the mount shows only decoded views, and a late
    /// file has none).
    hide_jpegs: bool,
    /// Any name changed yet (until then every answer is the catalog's, without a lock).
    any: AtomicBool,
    state: RwLock<ChangeSet>,
    /// What was noticed.
    pub stats: ChangeStats,
    /// With `--allow-other`: the tree's owner and group; a late file or directory owned by
    /// anyone else is not served (shown as the tree owner's, it would let that user read it).
    owner: std::sync::OnceLock<(u32, u32)>,
    /// Whether such a name was logged.
    owner_logged: AtomicBool,
}

impl std::fmt::Debug for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes").field("root", &self.root).finish()
    }
}

/// What a change did to a name, for the kernel's caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Noted {
    /// The directory's inode.
    pub dir: u64,
    /// The name.
    pub name: Vec<u8>,
    /// The inodes the mount answered for it (the file, its `.npy` view), whose cached pages
    /// and attributes are stale.
    pub was: Vec<u64>,
}

/// A name as the disk has it, against the snapshot.
enum Now {
    /// As the walk saw it: the served catalog answers.
    Unchanged,
    /// Added or replaced: a late node.
    Late(Attr),
}

impl Changes {
    /// Changes of the directory `root` served as `catalog`, whose index `raw` shows without
    /// views, over `files` (its walk).
    pub fn new(
        root: PathBuf,
        catalog: Arc<dyn Catalog>,
        raw: Arc<dyn Catalog>,
        files: Arc<FileSet>,
    ) -> Changes {
        let mut state = ChangeSet::default();
        state.dirs.insert(crate::ino::ROOT_INO, PathBuf::new());
        Changes {
            root,
            hide_jpegs: catalog.views().hides_jpeg(),
            catalog,
            raw,
            files,
            any: AtomicBool::new(false),
            owner: std::sync::OnceLock::new(),
            owner_logged: AtomicBool::new(false),
            state: RwLock::new(state),
            stats: ChangeStats::default(),
        }
    }

    /// Serves late names owned by user `uid` and group `gid` only (a mount other users read:
    /// every file is shown as the tree owner's, see `loosefs mount --allow-other`).
    pub fn require_owner(&self, uid: u32, gid: u32) {
        let _ = self.owner.set((uid, gid));
    }

    /// The directory served.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn read(&self) -> RwLockReadGuard<'_, ChangeSet> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, ChangeSet> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that directory `rel` (relative to the root) is watched and returns its inode
    /// (a catalog directory's or a late one's). `None`: no directory of the mount is there.
    pub fn watched(&self, rel: &Path) -> Option<u64> {
        let mut ino = crate::ino::ROOT_INO;
        for part in rel.iter() {
            let a = self.lookup_any(ino, part.as_bytes()).ok()?;
            if a.kind != Kind::Dir {
                return None;
            }
            ino = a.ino;
        }
        if !matches!(Node::of(ino), Some(Node::Late(_))) {
            self.write().dirs.insert(ino, rel.to_path_buf());
        }
        Some(ino)
    }

    /// `name` in `parent` as the mount shows it, its stored bytes under their own name.
    fn lookup_any(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        match self.lookup(parent, name) {
            Some(r) => r,
            None => self.raw.lookup(parent, name),
        }
    }

    /// Looks `name` up in `parent` when the answer is this module's: `parent` is late, or
    /// `name` changed in it. `None`: the catalog answers.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Option<Result<Attr, FsError>> {
        if !self.any.load(Relaxed) && !matches!(Node::of(parent), Some(Node::Late(_))) {
            return None;
        }
        if name == b"." || name == b".." {
            let Some(Node::Late(k)) = Node::of(parent) else {
                return None;
            };
            let d = self.read().late.get(&k).map(|d| (d.attr, d.parent));
            return Some(match d {
                Some((a, _)) if name == b"." => Ok(a),
                Some((_, p)) => match Node::of(p) {
                    Some(Node::Late(pk)) => self.getattr(pk),
                    _ => self.catalog.getattr(p),
                },
                None => Err(FsError::NotFound),
            });
        }
        let (rel, snap) = {
            let st = self.read();
            match Node::of(parent) {
                Some(Node::Late(k)) => match st.late.get(&k) {
                    Some(d) if d.attr.kind == Kind::Dir => (d.rel.clone(), None),
                    Some(_) => return Some(Err(FsError::NotDir)),
                    None => return Some(Err(FsError::NotFound)),
                },
                _ => {
                    if !st.changed.get(&parent).is_some_and(|n| n.contains(name)) {
                        return None;
                    }
                    let dir = st.dirs.get(&parent)?.clone();
                    (dir, self.raw.lookup(parent, name).ok())
                }
            }
        };
        Some(match self.resolve(parent, &rel, name, snap) {
            Ok(Now::Unchanged) => self.catalog.lookup(parent, name),
            Ok(Now::Late(a)) => Ok(a),
            Err(e) => Err(e),
        })
    }

    /// `name` in directory `rel` (inode `parent`) as the disk has it now: unchanged from the
    /// snapshot's record `snap` (as [`Changes::raw`] gives it), or a late node. Errors:
    /// [`FsError::NotFound`] (gone, a link or special file, a JPEG the mount hides).
    fn resolve(
        &self,
        parent: u64,
        rel: &Path,
        name: &[u8],
        snap: Option<Attr>,
    ) -> Result<Now, FsError> {
        let rel = rel.join(OsStr::from_bytes(name));
        let meta = match crate::storage::files::metadata_beneath(&self.root, &rel) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(FsError::NotFound),
            Err(e) => return Err(FsError::Io(format!("{}: {e}", rel.display()))),
        };
        // As `pack` walks: symbolic links and special files are left out.
        let kind = match meta.file_type() {
            t if t.is_dir() => Kind::Dir,
            t if t.is_file() => Kind::File,
            _ => return Err(FsError::NotFound),
        };
        if let Some(&(uid, gid)) = self.owner.get() {
            use std::os::unix::fs::MetadataExt;
            if (meta.uid(), meta.gid()) != (uid, gid) {
                if !self
                    .owner_logged
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    log::warn!(
                        "{}: owned by {}:{}, not by the tree's owner {uid}:{gid}: not served \
                         on this --allow-other mount (nor any such name after it; logged once)",
                        rel.display(),
                        meta.uid(),
                        meta.gid()
                    );
                }
                return Err(FsError::NotFound);
            }
        }
        let stamp = Stamp::of(&meta);
        if snap.is_some_and(|a| a.kind == kind)
            && (kind == Kind::Dir || self.snapshot_stamp(&rel) == Some(stamp))
        {
            return Ok(Now::Unchanged);
        }
        if kind == Kind::File && self.hide_jpegs && is_jpeg(&self.root.join(&rel)) {
            return Err(FsError::NotFound);
        }
        let mut st = self.write();
        if let Some(&k) = st.by_path.get(&rel) {
            let l = st.late.get_mut(&k).expect("by_path names a late node");
            let same = match kind {
                Kind::Dir => l.attr.kind == Kind::Dir && l.stamp.ino == stamp.ino,
                Kind::File => l.attr.kind == Kind::File && l.stamp == stamp,
            };
            if same {
                return Ok(Now::Late(l.attr));
            }
            l.current = false;
        }
        let k = st.next;
        st.next += 1;
        let attr = late_attr(Node::Late(k).ino(), kind, &meta);
        st.by_path.insert(rel.clone(), k);
        let node = Late {
            rel,
            stamp,
            attr,
            parent,
            current: true,
            reported: Arc::default(),
        };
        st.late.insert(k, node);
        self.stats.late_nodes.store(st.late.len() as u64, Relaxed);
        Ok(Now::Late(attr))
    }

    /// The stamp the walk recorded for the file at `rel`. The walk's files lie in storage
    /// order, which is the order of their paths (depth first, names sorted by bytes), so a
    /// binary search by path finds it, empty files (which share a base) included.
    fn snapshot_stamp(&self, rel: &Path) -> Option<Stamp> {
        let files = self.files.files();
        let k = files.binary_search_by(|f| f.rel.as_path().cmp(rel)).ok()?;
        Some(files[k].stamp)
    }

    /// Attributes of late node `k`. Errors: [`FsError::NotFound`] (forgotten).
    pub fn getattr(&self, k: u64) -> Result<Attr, FsError> {
        (self.read().late.get(&k))
            .map(|l| l.attr)
            .ok_or(FsError::NotFound)
    }

    /// The kernel forgot late node `k`: a node no longer current is dropped.
    pub fn forget(&self, k: u64) {
        let mut st = self.write();
        if st.late.get(&k).is_some_and(|l| !l.current) {
            st.late.remove(&k);
            self.stats.late_nodes.store(st.late.len() as u64, Relaxed);
        }
    }

    /// Path of late node `k` for log messages.
    pub fn path_of(&self, k: u64) -> String {
        (self.read().late.get(&k)).map_or_else(
            || format!("late inode {k}"),
            |l| l.rel.display().to_string(),
        )
    }
}

/// Whether the file at `path` starts as a JPEG does (SOI and a marker).
fn is_jpeg(path: &Path) -> bool {
    let mut head = [0u8; 3];
    crate::storage::files::open_original(path).is_ok_and(|f| f.read_exact_at(&mut head, 0).is_ok())
        && head == [0xFF, 0xD8, 0xFF]
}

/// Attributes of a late node `ino` of `kind` from its metadata, as the catalog shows them.
fn late_attr(ino: u64, kind: Kind, m: &std::fs::Metadata) -> Attr {
    let nsec = m.mtime_nsec().clamp(0, 999_999_999) as u32;
    Attr::shown(ino, kind, m.len(), m.mtime(), nsec, m.mode())
}

mod note;
mod read;
mod readdir;
#[cfg(test)]
pub(super) mod tests;
