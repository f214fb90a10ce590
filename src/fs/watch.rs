//! The watcher of a loose directory mount: inotify on every directory of the tree, each event
//! turned into a changed name ([`Changes::note`]) and handed to the kernel-cache callback
//! (the mount drops the kernel's entry for the name and the pages of the file it named).
//!
//! Watches are added before [`start`] returns; the thread then compares the tree with the
//! snapshot once ([`Changes::rescan`]: what changed between the walk and the watches), and
//! again whenever the kernel's event queue overflowed (`IN_Q_OVERFLOW`, events lost).
//! Directories created later are watched as their creation is seen. A directory that cannot
//! be watched (the `fs.inotify.max_user_watches` limit) is counted and logged once: its
//! changes show at the next mount, and a changed file still answers EIO rather than mixed
//! bytes (the storage's own check).

use super::changes::{Changes, Noted};
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// What the kernel should forget after a change (the mount: `inval_entry` of the name,
/// `inval_inode` of the inode it named).
pub type Forget = Box<dyn Fn(&Noted) + Send>;

/// Events that change what a name is: created, removed, moved in or out, written (each
/// `write`, so a writer that keeps its descriptor open is seen too; writes through a shared
/// mapping make no event), closed after writing, attributes changed (`touch`, `chmod`).
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
}

struct Watcher {
    inotify: Inotify,
    changes: Arc<Changes>,
    /// Each watch's directory: inode and path relative to the root.
    dirs: HashMap<WatchDescriptor, (u64, PathBuf)>,
    forget: Forget,
    warned: bool,
}

/// Watches every directory of `changes`' tree and starts the thread that handles events.
/// Errors: inotify cannot be set up (no watch at all: the caller logs that changes show at
/// the next mount).
pub fn start(changes: Arc<Changes>, forget: Forget) -> std::io::Result<()> {
    let w = Watcher::new(changes, forget)?;
    std::thread::Builder::new()
        .name("loosefs-watch".into())
        .spawn(move || w.run())?;
    Ok(())
}

impl Watcher {
    /// A watch on every directory of `changes`' tree (events not read yet).
    fn new(changes: Arc<Changes>, forget: Forget) -> std::io::Result<Watcher> {
        let inotify = Inotify::init()?;
        let mut w = Watcher {
            inotify,
            changes,
            dirs: HashMap::new(),
            forget,
            warned: false,
        };
        let t0 = std::time::Instant::now();
        for (ino, rel) in w.changes.snapshot_dirs() {
            w.watch(ino, rel);
        }
        log::info!(
            "watching {} directories of {} for changes ({:.1} ms)",
            w.dirs.len(),
            w.changes.root().display(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        Ok(w)
    }

    fn watch(&mut self, ino: u64, rel: PathBuf) {
        match self
            .inotify
            .watches()
            .add(self.changes.root().join(&rel), mask())
        {
            Ok(wd) => {
                self.dirs.insert(wd, (ino, rel));
                self.changes
                    .stats
                    .watched
                    .store(self.dirs.len() as u64, Relaxed);
            }
            Err(e) => {
                self.changes.stats.unwatched.fetch_add(1, Relaxed);
                if !std::mem::replace(&mut self.warned, true) {
                    log::warn!(
                        "cannot watch {} ({e}; see fs.inotify.max_user_watches): changes there show at the next mount",
                        self.changes.root().join(&rel).display()
                    );
                }
            }
        }
    }

    /// Watches directory `rel`, just created, and every directory under it; adds their
    /// inodes to `watched`.
    fn watch_new(&mut self, rel: &Path, watched: &mut Vec<u64>) {
        let Some(ino) = self.changes.watched(rel) else {
            return;
        };
        self.watch(ino, rel.to_path_buf());
        watched.push(ino);
        let Ok(rd) = std::fs::read_dir(self.changes.root().join(rel)) else {
            return;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                self.watch_new(&rel.join(e.file_name()), watched);
            }
        }
    }

    fn run(mut self) {
        let t0 = std::time::Instant::now();
        let found = self.changes.rescan();
        log::info!(
            "compared {} with the mount's walk: {} names changed between them ({:.1} ms)",
            self.changes.root().display(),
            found.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        for n in found {
            (self.forget)(&n);
        }
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let events: Vec<_> = match self.inotify.read_events_blocking(&mut buf) {
                Ok(ev) => ev
                    .map(|e| (e.wd, e.mask, e.name.map(|n| n.as_bytes().to_vec())))
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!(
                        "the watch of {} stopped: {e}",
                        self.changes.root().display()
                    );
                    return;
                }
            };
            for (wd, mask, name) in written_once(events) {
                self.event(wd, mask, name);
            }
        }
    }

    fn event(&mut self, wd: WatchDescriptor, mask: EventMask, name: Option<Vec<u8>>) {
        if mask.contains(EventMask::Q_OVERFLOW) {
            log::warn!(
                "changes under {} came faster than they were read: comparing the tree again",
                self.changes.root().display()
            );
            for n in self.changes.rescan() {
                (self.forget)(&n);
            }
            return;
        }
        if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF)
            && self
                .dirs
                .get(&wd)
                .is_some_and(|(ino, _)| *ino == crate::ino::ROOT_INO)
        {
            log::error!(
                "the source directory {} was {} while mounted: the mount shows no file of it \
                 from now on; put it back, then unmount and mount it again",
                self.changes.root().display(),
                if mask.contains(EventMask::DELETE_SELF) {
                    "deleted"
                } else {
                    "moved away"
                }
            );
            return;
        }
        if mask.contains(EventMask::IGNORED) {
            self.dirs.remove(&wd);
            self.changes
                .stats
                .watched
                .store(self.dirs.len() as u64, Relaxed);
            return;
        }
        let (Some((dir, rel)), Some(name)) = (self.dirs.get(&wd).cloned(), name) else {
            return;
        };
        if dir == crate::ino::ROOT_INO && name == crate::ino::CONTROL_DIR_NAME {
            return;
        }
        // Once noted, a lookup answers the name as the disk has it, so the kernel forgets
        // its cached entry and listing at once: a reader never finds the name by lookup and
        // misses it in the listing for longer than this step.
        let noted = self.changes.note(dir, &name);
        (self.forget)(&noted);
        if mask.contains(EventMask::ISDIR)
            && mask.intersects(EventMask::CREATE | EventMask::MOVED_TO)
        {
            // A new directory and those under it: the kernel may have listed them before
            // their watches existed, and a name added in between had no event; with every
            // watch in place, those listings are forgotten too.
            let mut watched = Vec::new();
            self.watch_new(&rel.join(OsStr::from_bytes(&name)), &mut watched);
            if !watched.is_empty() {
                (self.forget)(&Noted {
                    was: watched,
                    ..noted
                });
            }
        }
    }
}

/// One batch of events, each name's writes (`IN_MODIFY`) left out where a later event of the
/// batch notes the same name: a writer's many `write` calls make one note per batch, not one
/// per call (the note reads the name as the disk has it, so the last one is enough).
fn written_once<W: Eq + std::hash::Hash + Clone>(
    events: Vec<(W, EventMask, Option<Vec<u8>>)>,
) -> Vec<(W, EventMask, Option<Vec<u8>>)> {
    let mut later = std::collections::HashSet::new();
    let mut kept: Vec<_> = (events.into_iter().rev())
        .filter(|(wd, mask, name)| {
            let key = (wd.clone(), name.clone());
            let seen = !later.insert(key);
            !(seen && *mask == EventMask::MODIFY)
        })
        .collect();
    kept.reverse();
    kept
}

/// A [`Forget`] that sends every note to the returned receiver (tests wait on it).
#[cfg(test)]
pub(crate) fn forget_to_channel() -> (Forget, std::sync::mpsc::Receiver<Noted>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let forget: Forget = Box::new(move |n: &Noted| {
        let _ = tx.send(n.clone());
    });
    (forget, rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::Views;
    use std::sync::mpsc;

    /// A watcher over a small tree whose events are handed over by hand; what it tells the
    /// kernel goes to the returned channel.
    fn watcher(root: &Path) -> (Watcher, mpsc::Receiver<Noted>) {
        std::fs::create_dir_all(root.join("d/sub")).unwrap();
        std::fs::write(root.join("d/a"), b"a").unwrap();
        let (ch, _) = crate::fs::changes::tests::changes_with(root, Views::default());
        let (forget, rx) = forget_to_channel();
        (Watcher::new(ch, forget).unwrap(), rx)
    }

    #[test]
    fn lost_events_are_found_again_by_comparing_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut w, rx) = watcher(tmp.path());
        assert_eq!(w.dirs.len(), 3, "the root, d and d/sub");
        std::fs::write(tmp.path().join("d/b"), b"new").unwrap();
        std::fs::remove_file(tmp.path().join("d/a")).unwrap();
        // The kernel's queue overflowed: the events above are taken as lost.
        let wd = w.dirs.keys().next().unwrap().clone();
        w.event(wd, EventMask::Q_OVERFLOW, None);
        let mut told: Vec<String> = rx
            .try_iter()
            .map(|n| String::from_utf8_lossy(&n.name).into_owned())
            .collect();
        told.sort();
        assert_eq!(told, ["a", "b"], "the kernel is told of both");
        assert_eq!(w.changes.stats.rescans.load(Relaxed), 1);
        let d = w.changes.watched(Path::new("d")).unwrap();
        assert_eq!(
            w.changes.lookup(d, b"a"),
            Some(Err(crate::catalog::FsError::NotFound))
        );
        assert!(matches!(w.changes.lookup(d, b"b"), Some(Ok(a)) if a.size == 3));
    }

    #[test]
    fn a_directory_removed_is_no_longer_watched_and_the_control_name_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut w, rx) = watcher(tmp.path());
        std::fs::remove_dir(tmp.path().join("d/sub")).unwrap();
        let mut buf = vec![0u8; 4096];
        // The removal's events: DELETE in d (noted), then IGNORED for the watch of d/sub.
        let mut seen_ignored = false;
        while !seen_ignored {
            let events: Vec<_> = (w.inotify.read_events_blocking(&mut buf).unwrap())
                .map(|e| (e.wd, e.mask, e.name.map(|n| n.as_bytes().to_vec())))
                .collect();
            for (wd, mask, name) in events {
                seen_ignored |= mask.contains(EventMask::IGNORED);
                w.event(wd, mask, name);
            }
        }
        assert_eq!(w.dirs.len(), 2);
        assert_eq!(w.changes.stats.watched.load(Relaxed), 2);
        assert!(rx.try_iter().any(|n| n.name == b"sub"));
        let root = w
            .dirs
            .keys()
            .find(|k| w.dirs[*k].0 == crate::ino::ROOT_INO)
            .unwrap()
            .clone();
        let before = w.changes.stats.events.load(Relaxed);
        w.event(root, EventMask::CREATE, Some(b".loosefs".to_vec()));
        assert_eq!(
            w.changes.stats.events.load(Relaxed),
            before,
            "the control directory's name"
        );
        assert!(rx.try_iter().next().is_none());
    }

    /// A directory created with others under it (`mkdir -p`): the kernel is told of its name
    /// before the new watches are added (a lookup answers it from then on), then of every
    /// new directory's inode once all of them are watched (listings cached in between).
    #[test]
    fn a_new_tree_is_forgotten_when_noted_and_again_once_watched() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut w, rx) = watcher(tmp.path());
        std::fs::create_dir_all(tmp.path().join("n/m")).unwrap();
        let root = (w.dirs.iter())
            .find(|(_, d)| d.0 == crate::ino::ROOT_INO)
            .map(|(wd, _)| wd.clone())
            .unwrap();
        w.event(
            root,
            EventMask::CREATE | EventMask::ISDIR,
            Some(b"n".to_vec()),
        );
        let told: Vec<Noted> = rx.try_iter().collect();
        assert_eq!(told.len(), 2, "{told:?}");
        assert_eq!(
            (told[0].dir, &told[0].name[..]),
            (crate::ino::ROOT_INO, &b"n"[..])
        );
        assert!(told[0].was.is_empty(), "nothing was cached for a new name");
        let n = w.changes.watched(Path::new("n")).unwrap();
        let m = w.changes.watched(Path::new("n/m")).unwrap();
        assert_eq!(told[1].was, [n, m], "both new directories, once watched");
        assert_eq!(w.dirs.len(), 5, "the root, d, d/sub, n and n/m");
    }

    #[test]
    fn a_writers_many_writes_make_one_note_per_batch() {
        let (m, c, d) = (EventMask::MODIFY, EventMask::CLOSE_WRITE, EventMask::DELETE);
        let e = |w: u8, mask, n: &str| (w, mask, Some(n.as_bytes().to_vec()));
        let got = written_once(vec![
            e(1, m, "a"),
            e(1, m, "b"),
            e(1, m, "a"),
            e(2, m, "a"),
            e(1, c, "a"),
            e(1, d, "b"),
            e(1, d, "b"),
        ]);
        assert_eq!(
            got,
            [e(2, m, "a"), e(1, c, "a"), e(1, d, "b"), e(1, d, "b")],
            "writes before a later event of the same name go; other events all stay"
        );
    }
}
