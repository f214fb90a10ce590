//! Noting a change: the name marked changed in its directory (or forgotten, when it is neither
//! on the disk nor in the snapshot), its late node superseded when the file is gone, and the
//! inodes the kernel holds for it named for invalidation.

use super::{ChangeSet, Changes, Noted};
use crate::ino::Node;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

impl Changes {
    /// Notes that `name` in directory `dir` changed; returns what the kernel should forget.
    pub fn note(&self, dir: u64, name: &[u8]) -> Noted {
        self.stats.events.fetch_add(1, Relaxed);
        let was = {
            let st = self.read();
            match Node::of(dir) {
                Some(Node::Late(k)) => (st.late.get(&k).and_then(|d| {
                    st.by_path
                        .get(&d.rel.join(OsStr::from_bytes(name)))
                        .map(|&k| Node::Late(k).ino())
                }))
                .into_iter()
                .collect(),
                _ => self.current(&st, dir, name),
            }
        };
        let late_dir = matches!(Node::of(dir), Some(Node::Late(_)));
        let path = self.path_in(dir, name);
        let gone = path
            .as_ref()
            .is_some_and(|p| crate::storage::files::metadata_beneath(&self.root, p).is_err());
        // Neither on the disk nor in the snapshot (a temporary name come and gone): the
        // catalog's answer is right again, and nothing is kept for it.
        let forgotten = gone && (late_dir || self.raw.lookup(dir, name).is_err());
        let mut st = self.write();
        if let Some(k) = path.filter(|_| gone).and_then(|p| st.by_path.remove(&p)) {
            if let Some(l) = st.late.get_mut(&k) {
                l.current = false;
            }
        }
        if forgotten {
            if let Some(names) = st.changed.get_mut(&dir) {
                names.remove(name);
            }
        } else if !late_dir {
            st.changed.entry(dir).or_default().insert(name.to_vec());
            self.any.store(true, Relaxed);
        }
        drop(st);
        Noted {
            dir,
            name: name.to_vec(),
            was,
        }
    }

    /// Path of `name` in directory `dir` (a watched catalog directory or a late one).
    fn path_in(&self, dir: u64, name: &[u8]) -> Option<PathBuf> {
        let st = self.read();
        let d = match Node::of(dir) {
            Some(Node::Late(k)) => &st.late.get(&k)?.rel,
            _ => st.dirs.get(&dir)?,
        };
        Some(d.join(OsStr::from_bytes(name)))
    }

    /// The inodes last answered for `name` in catalog directory `dir`: its late node's, or
    /// its record's and that record's `.npy` view's.
    fn current(&self, st: &ChangeSet, dir: u64, name: &[u8]) -> Vec<u64> {
        let is_changed = st.changed.get(&dir).is_some_and(|n| n.contains(name));
        let late =
            (st.dirs.get(&dir)).and_then(|d| st.by_path.get(&d.join(OsStr::from_bytes(name))));
        match late {
            Some(&k) if is_changed => vec![Node::Late(k).ino()],
            _ => match self
                .raw
                .lookup(dir, name)
                .ok()
                .and_then(|a| Node::of(a.ino))
            {
                Some(Node::Record(r)) => vec![Node::Record(r).ino(), Node::Npy(r).ino()],
                _ => Vec::new(),
            },
        }
    }
}
