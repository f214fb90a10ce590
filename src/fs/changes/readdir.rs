//! Listings of what changed: a catalog directory's listing with its changed names as the disk
//! has them, a late directory's from the disk, the snapshot's directories for the watcher, and
//! the comparison of the tree with the snapshot after lost events.

use super::{Changes, Noted, Now};
use crate::catalog::{DirEntry, FsError, Kind};
use crate::ino::Node;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

/// Entries of a listing: name, inode, kind.
type Listing = Vec<(Vec<u8>, u64, Kind)>;

impl Changes {
    /// Every directory of the snapshot with its path relative to the root (the root first),
    /// each recorded for [`Changes::lookup`].
    pub fn snapshot_dirs(&self) -> Vec<(u64, PathBuf)> {
        let mut out = vec![(crate::ino::ROOT_INO, PathBuf::new())];
        let mut i = 0;
        while i < out.len() {
            let (ino, rel) = out[i].clone();
            let _ = self.raw.readdir(ino, 2, &mut |e| {
                if e.kind == Kind::Dir && matches!(Node::of(e.ino), Some(Node::Record(_))) {
                    out.push((e.ino, rel.join(OsStr::from_bytes(&e.name))));
                }
                false
            });
            i += 1;
        }
        self.write().dirs.extend(out.iter().cloned());
        out
    }

    /// Lists `ino` from `offset` when the listing is this module's (a late directory, or a
    /// catalog directory with changed names); `None`: the catalog lists it.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Option<Result<(), FsError>> {
        let late = matches!(Node::of(ino), Some(Node::Late(_)));
        if !late && !self.any.load(Relaxed) {
            return None;
        }
        let listing = if late {
            self.late_listing(ino)
        } else {
            self.changed_listing(ino)?
        };
        let list = match listing {
            Ok(l) => l,
            Err(e) => return Some(Err(e)),
        };
        for (i, (name, ino, kind)) in list.iter().enumerate().skip(offset as usize) {
            let e = DirEntry {
                ino: *ino,
                next_offset: i as u64 + 1,
                kind: *kind,
                name: Cow::Borrowed(name),
            };
            if add(e) {
                break;
            }
        }
        Some(Ok(()))
    }

    /// The listing of catalog directory `ino` with its changed names as the disk has them.
    fn changed_listing(&self, ino: u64) -> Option<Result<Listing, FsError>> {
        let (names, rel) = {
            let st = self.read();
            (st.changed.get(&ino)?.clone(), st.dirs.get(&ino)?.clone())
        };
        let mut list = Vec::new();
        let r = self.catalog.readdir(ino, 0, &mut |e| {
            if list.len() < 2 || !names.contains(&*e.name) {
                list.push((e.name.into_owned(), e.ino, e.kind));
            }
            false
        });
        if let Err(e) = r {
            return Some(Err(e));
        }
        for name in &names {
            let snap = self.raw.lookup(ino, name).ok();
            let a = match self.resolve(ino, &rel, name, snap) {
                Ok(Now::Unchanged) => self.catalog.lookup(ino, name),
                Ok(Now::Late(a)) => Ok(a),
                Err(e) => Err(e),
            };
            match a {
                Ok(a) => list.push((name.clone(), a.ino, a.kind)),
                Err(FsError::NotFound) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        if let Some(kids) = list.get_mut(2..) {
            kids.sort_by(|a, b| a.0.cmp(&b.0));
        }
        Some(Ok(list))
    }

    /// The listing of late directory `ino`, from the disk (names sorted by bytes).
    fn late_listing(&self, ino: u64) -> Result<Listing, FsError> {
        let Some(Node::Late(k)) = Node::of(ino) else {
            return Err(FsError::NotFound);
        };
        let (rel, parent) = {
            let st = self.read();
            let d = st.late.get(&k).ok_or(FsError::NotFound)?;
            if d.attr.kind != Kind::Dir {
                return Err(FsError::NotDir);
            }
            (d.rel.clone(), d.parent)
        };
        let io = |e: std::io::Error| FsError::Io(format!("{}: {e}", rel.display()));
        let mut names = Vec::new();
        for e in crate::storage::files::read_dir_beneath(&self.root, &rel).map_err(io)? {
            names.push(e.name);
        }
        names.sort();
        let mut list = vec![
            (b".".to_vec(), ino, Kind::Dir),
            (b"..".to_vec(), parent, Kind::Dir),
        ];
        for name in names {
            match self.resolve(ino, &rel, &name, None) {
                Ok(Now::Late(a)) => list.push((name, a.ino, a.kind)),
                Ok(Now::Unchanged) | Err(FsError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(list)
    }

    /// Compares every watched catalog directory with the disk (names and inode numbers, no
    /// file is opened or stat'ed) and notes each name that differs: what a lost event may
    /// have hidden. Returns the names noted.
    pub fn rescan(&self) -> Vec<Noted> {
        self.stats.rescans.fetch_add(1, Relaxed);
        let dirs: Vec<(u64, PathBuf)> = self.read().dirs.clone().into_iter().collect();
        let mut out = Vec::new();
        for (ino, rel) in dirs {
            let mut snap = HashMap::new();
            let _ = self.raw.readdir(ino, 2, &mut |e| {
                // Views are named by the mount, not the disk.
                if matches!(Node::of(e.ino), Some(Node::Record(_))) {
                    snap.insert(e.name.into_owned(), (e.ino, e.kind));
                }
                false
            });
            let Ok(rd) = crate::storage::files::read_dir_beneath(&self.root, &rel) else {
                continue;
            };
            let mut seen = HashSet::new();
            for e in rd {
                let name = e.name;
                let differs = match snap.get(&name) {
                    Some(&(_, Kind::File)) => {
                        let p = rel.join(OsStr::from_bytes(&name));
                        self.snapshot_stamp(&p).is_none_or(|s| s.ino != e.ino)
                    }
                    Some(&(_, Kind::Dir)) => e.is_dir == Some(false),
                    None => true,
                };
                if differs && !(ino == crate::ino::ROOT_INO && name == crate::ino::CONTROL_DIR_NAME)
                {
                    out.push(self.note(ino, &name));
                }
                seen.insert(name);
            }
            for name in snap.into_keys().filter(|n| !seen.contains(n)) {
                out.push(self.note(ino, &name));
            }
        }
        out
    }
}
